from autohet_ray.profile.analytic import analytic_layer, analytic_links, analytic_profile
from autohet_ray.profile.db import LayerProfile, LinkProfile, ProfileDB, load_profile, profile_from_dict

__all__ = ["analytic_layer", "analytic_links", "analytic_profile", "LayerProfile", "LinkProfile", "ProfileDB",
           "load_profile", "profile_from_dict"]
