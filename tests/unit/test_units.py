"""Times and sizes read right at every scale: the unit follows the value."""
from autohet_ray.cli.units import plural, seconds, size


def test_seconds_scale_to_their_unit():
    assert [seconds(x) for x in (0, 2.5e-7, 8.5e-4, 1.25e-3, 0.0999, 2.41, 1234.0)] == \
        ["0 s", "0.25 µs", "850 µs", "1.25 ms", "99.9 ms", "2.41 s", "1234 s"]


def test_sizes_scale_to_their_unit():
    assert [size(x) for x in (0, 512, 338_000, 2.5e6, 79.3e9, 1.2e12)] == \
        ["0 B", "512 B", "338 KB", "2.5 MB", "79.3 GB", "1200 GB"]


def test_a_count_has_its_noun_in_the_right_number():
    assert (plural(1, "pipeline"), plural(3, "pipeline")) == ("1 pipeline", "3 pipelines")
