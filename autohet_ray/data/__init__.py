"""Real training data: token shards with an index, the plan-independent sample order, validation batches,
prefetching and the masked-language-modelling objective. Pure: no Ray, no torch.distributed."""
from autohet_ray.data.dataset import Dataset, check_corpus_size, check_fits_model, read_index
from autohet_ray.data.index import DataIndex, ShardInfo
from autohet_ray.data.mlm import mask_tokens
from autohet_ray.data.prefetch import Prefetcher

__all__ = ["Dataset", "DataIndex", "Prefetcher", "ShardInfo", "check_corpus_size", "check_fits_model",
           "mask_tokens", "read_index"]
