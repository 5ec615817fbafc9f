"""Plots that mean something (issue 39, item 4): a share on a fixed 0-100% scale or an explicit
labelled range from zero, a unit on every axis and colour bar, a caption that opens with what to
look for; colour scales fixed wide enough that run-to-run noise of 0.1% stays one colour."""
from __future__ import annotations

import pytest

from trainops.skills.evidence import plots
from trainops.skills.evidence.bottleneck import BottleneckSplit, RankTiming, TimeShare
from trainops.skills.evidence.pack import assemble
from trainops.workspace import runs_dir


@pytest.fixture
def drawn(monkeypatch):
    """Every matplotlib figure the plots draw, by plot name, kept open for the test to read."""
    kept = []
    original = plots._png

    def keep(plt, fig, **kw):
        kept.append(fig)
        return original(plt, fig, **kw)
    monkeypatch.setattr(plots, "_png", keep)
    return kept


def _pack(factories):
    runs = [str(factories.write_run(runs_dir() / f"base-{i}", step_time_s=0.1 * (1 + 0.001 * i))) for i in (1, 2)]
    share = TimeShare(seconds=1.0, share_pct=1.0, method="test")
    split = BottleneckSplit(wall_time_s=100.0, compute=share, communication=share, data_loading=share,
                            scheduling=share, startup=share, remainder=share, queue_wait_s=0.0, idle_allocated_s=1.0,
                            layout={"dp": 2, "tp": 1, "pp": 1}, ranks_run=runs[0],
                            ranks=[RankTiming(rank=0, dp=0, tp=0, pp=0, step_time_median_s=0.1000,
                                              exposed_comm_share_pct=55.0),
                                   RankTiming(rank=1, dp=1, tp=0, pp=0, step_time_median_s=0.1001,
                                              exposed_comm_share_pct=20.0)])
    base = factories.baseline(runs).model_copy(update={"bottleneck": split})
    return assemble("pack-plots", factories.environment(), base, [factories.ablation()], [factories.drill()], [])


def _axes(fig):
    """The plot's own axes (colour bars apart) and its colour bars' axes."""
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    return [ax for ax in fig.axes if ax not in bars], bars


def test_every_axis_and_colour_bar_names_its_unit(factories, drawn):
    figures = plots.all_plots(_pack(factories))
    assert {f.name for f in figures} == {"loss_mfu", "rank_step_heatmap", "layout_view", "ablation", "drill_timeline"}
    for fig in drawn:
        axes, bars = _axes(fig)
        for ax in axes:
            for label in (ax.get_xlabel(), ax.get_ylabel()):
                assert "(" in label and ")" in label, (ax.get_title(), label)
        for bar in bars:
            label = bar.get_ylabel() or bar.get_xlabel()
            assert "(" in label and ")" in label, label


def test_every_caption_opens_with_what_to_look_for_on_one_line(factories):
    for figure in plots.all_plots(_pack(factories)):
        assert figure.caption.startswith("Look for: ") and "\n" not in figure.caption, figure.name
        assert len(figure.caption.split(". ")[0]) <= 200, figure.caption


def test_mfu_is_drawn_from_zero_on_a_labelled_range(factories, drawn):
    plots.curves(_pack(factories))
    (_, ax_mfu), _bars = _axes(drawn[-1])
    low, high = ax_mfu.get_ylim()
    assert low == 0 and f"0-{high:g}%" in ax_mfu.get_ylabel()


def test_step_time_colours_span_a_fixed_band_around_the_median_not_the_noise(factories, drawn):
    """Step times 0.1% apart must not span the whole colour scale: the scale is fixed at ±25% of the median."""
    pack = _pack(factories)
    for plot in (plots.rank_heatmap, plots.layout_view):
        plot(pack)
        _axes_, bars = _axes(drawn[-1])
        for image in (im for ax in _axes_ for im in ax.get_images()):
            assert image.get_clim() == (-25.0, 25.0), plot.__name__
        assert "median" in (bars[0].get_ylabel() or bars[0].get_xlabel())
