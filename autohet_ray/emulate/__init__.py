"""Device emulation: pace real CPU compute to the profile's predicted times of emulated GPUs."""
