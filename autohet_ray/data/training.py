"""What a job trains on: a prepared dataset (a local directory; orchestrate/data_prepare.py fetches an s3:// one),
or synthetic random tokens when none is given (and the run says so). Global batch i is batch i of the dataset's
plan-independent order, so a resumed or re-planned job reads exactly the samples the uninterrupted run would
have read; every committed step records the data position, and a resume refuses a dataset or tokenizer other
than the one the checkpoint trained on."""
from __future__ import annotations

from autohet_ray import ConfigError
from autohet_ray.data.dataset import Dataset, check_corpus_size, check_fits_model
from autohet_ray.data.mlm import mask_tokens
from autohet_ray.data.prefetch import Prefetcher
from autohet_ray.data.synthetic import synthetic_batch


class TrainingData:
    def __init__(self, *, data: str | None, model, global_batch: int, seq_len: int, seed: int):
        self.model, self.global_batch, self.seq_len, self.seed = model, global_batch, seq_len, seed
        self.dataset = self.prefetcher = self._validation = None
        if data is None:
            return
        self.dataset = Dataset.open(data)
        check_fits_model(self.dataset.index, model)
        check_corpus_size(self.dataset, global_batch=global_batch, seq_len=seq_len)
        self.prefetcher = Prefetcher(self._build)

    def describe(self) -> str:
        if self.dataset is None:
            return "synthetic random tokens (no --data)"
        index = self.dataset.index
        return (f"dataset {self.dataset.directory} ({index.train_tokens} training tokens, vocabulary "
                f"{index.vocab_size}, {self.dataset.num_samples(self.seq_len)} samples per epoch)")

    def batch(self, step: int) -> dict:
        """Global batch `step` (the next one is prepared in the background meanwhile)."""
        if self.dataset is None:
            return synthetic_batch(vocab_size=self.model.vocab_size, global_batch=self.global_batch,
                                   seq_len=self.seq_len, seed=self.seed, step=step)
        return self.prefetcher.get(step)

    def _build(self, step: int) -> dict:
        batch = self.dataset.global_batch(step, self.global_batch, self.seq_len, self.seed)
        if self.model.family == "bert":          # bidirectional: masked-language modelling, not next token
            index = self.dataset.index
            batch = mask_tokens(batch, mask_id=index.mask_id, vocab_size=index.vocab_size, seed=self.seed,
                                step=step, special_ids=(index.eos_id,))
        return batch

    def validation(self, num_batches: int) -> list[dict]:
        """The validation split's first `num_batches` global batches (the same at every evaluation)."""
        if self._validation is None or len(self._validation) != num_batches:
            self._validation = self.dataset.val_batches(num_batches, self.global_batch, self.seq_len)
        return self._validation

    def state(self, step: int) -> dict:
        """The data position after `step` completed steps, for the step's manifest."""
        if self.dataset is None:
            return {"data": {"synthetic": True, "seed": self.seed}}
        return {"data": self.dataset.data_state(step, self.global_batch, self.seq_len, self.seed)}

    def check(self, recorded: dict, step: int) -> None:
        """ConfigError unless the restored step's recorded data position continues with this data at `step`."""
        state = recorded.get("data")
        if self.dataset is None or state is None or state.get("synthetic"):
            if self.dataset is not None and state is not None:
                raise ConfigError("the checkpoint trained on synthetic tokens; resume it without --data")
            return
        resumed_at = self.dataset.check_state(state, seq_len=self.seq_len, global_batch=self.global_batch,
                                              seed=self.seed)
        assert resumed_at == step, (resumed_at, step)

    def waited_s(self) -> float:
        """Seconds the last batch kept the step waiting (0 when it was prefetched in time)."""
        return self.prefetcher.last_wait_s if self.prefetcher is not None else 0.0

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()

