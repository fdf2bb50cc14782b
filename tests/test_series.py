"""contract.series.downsample: bounded series that keep floors and spikes (pure, synthetic data)."""

import math

import pytest

from contract.series import downsample
from contract.wire import MAX_REPORT_SAMPLES, Sample

MiB = 2**20


def test_360000_samples_fit_and_keep_the_extremes() -> None:
    # An hour at 100 Hz: a slowly rising floor, a checkpoint spike every 10 minutes,
    # one deep dip. Pure arithmetic, no randomness.
    samples = []
    for i in range(360_000):
        t = i / 100.0
        rss = 500 * MiB + i * 64 + int(4 * MiB * math.sin(i / 50.0))
        if i % 60_000 == 30_000:
            rss += 900 * MiB  # a spike of one sample
        if i == 123_457:
            rss = 100 * MiB  # the floor's lowest point
        samples.append(Sample.model_construct(t=t, rss=rss, anon=None, shared=None, gpu=None,
                                              step=i // 1000))  # fmt: skip
    out = downsample(samples, MAX_REPORT_SAMPLES)
    assert len(out) <= MAX_REPORT_SAMPLES
    assert len(out) > MAX_REPORT_SAMPLES * 0.9  # the budget is used, not wasted
    rss = [s.rss for s in out]
    assert max(rss) == max(s.rss for s in samples)
    assert min(rss) == min(s.rss for s in samples) == 100 * MiB
    times = [s.t for s in out]
    assert times == sorted(times)
    assert out[0] == samples[0] and out[-1] == samples[-1]
    # Every spike survives, not only the largest.
    spikes = [s for s in out if s.rss > 1300 * MiB]
    assert [round(s.t) for s in spikes] == [300, 900, 1500, 2100, 2700, 3300]
    # Kept samples are samples that were taken, never blends.
    taken = {(s.t, s.rss) for s in samples}
    assert all((s.t, s.rss) in taken for s in out)


def test_gpu_extremes_are_kept_too() -> None:
    samples = [Sample(t=i * 0.1, rss=MiB, gpu=(i % 7) * MiB) for i in range(10_000)]
    samples[4321] = Sample(t=432.1, rss=MiB, gpu=900 * MiB)
    out = downsample(samples, 400)
    assert len(out) <= 400
    assert max(s.gpu for s in out) == 900 * MiB
    assert min(s.gpu for s in out) == 0


def test_short_series_unchanged_and_bad_budget_refused() -> None:
    samples = [Sample(t=float(i), rss=i) for i in range(10)]
    assert downsample(samples, 10) == samples
    assert downsample([], 100) == []
    with pytest.raises(ValueError, match="at least 4"):
        downsample(samples, 3)


def test_gaps_in_time_leave_buckets_empty_never_over_budget() -> None:
    # Two bursts an hour apart: most buckets are empty.
    samples = [Sample(t=i * 0.01, rss=i) for i in range(5000)]
    samples += [Sample(t=3600 + i * 0.01, rss=5000 - i) for i in range(5000)]
    out = downsample(samples, 1000)
    assert 4 <= len(out) <= 1000
    assert [s.t for s in out] == sorted(s.t for s in out)
    assert max(s.rss for s in out) == 5000 and min(s.rss for s in out) == 0
