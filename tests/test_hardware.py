"""GPU catalog: loading, datasheet figures, overrides and error messages."""

from __future__ import annotations

import pytest

from simulator.errors import ConfigError
from simulator.hardware.catalog import GPUSpec, gpu_names, load_gpu

NAMES = [
    "A100-SXM-80GB", "H100-SXM-80GB", "H200-SXM-141GB", "B200", "B300", "GB200", "GB300", "H800"
]

# NVLink line rate per direction = links x per-link signalling rate (NVLink 3: 25 GB/s,
# NVLink 4: 26.5625, NVLink 5: 53.125); H800 keeps 8 of the H100's 18 links.
NVLINK_LINE = {
    "A100-SXM-80GB": (3, 12 * 25.0),
    "H100-SXM-80GB": (4, 18 * 26.5625),
    "H200-SXM-141GB": (4, 18 * 26.5625),
    "B200": (5, 18 * 53.125),
    "B300": (5, 18 * 53.125),
    "GB200": (5, 18 * 53.125),
    "GB300": (5, 18 * 53.125),
    "H800": (4, 8 * 26.5625),
}


def test_catalog_lists_the_gpus():
    assert gpu_names() == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_platform_defaults_follow_the_nvlink_generation(name):
    gpu = load_gpu(name)
    gen, line = NVLINK_LINE[name]
    assert gpu.nvlink_generation == gen and gpu.nvlink_line_GBps == pytest.approx(line)
    # the line rate is the datasheet's data rate plus the 64b/66b-class coding margin
    assert 1.0 <= gpu.nvlink_line_GBps / gpu.nvlink_GBps < 1.07
    assert gpu.nic_Gbps in (200.0, 400.0, 800.0) and gpu.pcie_GBps in (32.0, 64.0, 128.0)
    for key in ("nvlink_line_GBps", "nic_Gbps", "pcie_GBps"):
        assert gpu.sources.get(key), f"{name}: no source for {key}"


def test_block_scaled_peaks_only_on_blackwell():
    for name in ("B200", "B300", "GB200", "GB300"):
        gpu = load_gpu(name)
        assert gpu.peak_tflops["mxfp8"] == gpu.peak_tflops["fp8"]
        assert gpu.peak_tflops["nvfp4"] >= 2 * gpu.peak_tflops["fp8"]
    with pytest.raises(ConfigError, match="nvfp4"):
        load_gpu("H100-SXM-80GB").peak_flops("nvfp4")


@pytest.mark.parametrize("name", NAMES)
def test_every_gpu_loads_with_consistent_figures_and_sources(name):
    """Structural relations of every datasheet (not the figures themselves, which would be a
    copy of the catalog): fp16 = bf16, tf32 = bf16 / 2, and a source for every figure."""
    gpu = load_gpu(name)
    assert gpu.name == name
    bf16 = gpu.peak_tflops["bf16"]
    assert gpu.peak_flops("bf16") == pytest.approx(bf16 * 1e12)
    assert gpu.peak_tflops["fp16"] == gpu.peak_tflops["bf16"]
    assert gpu.peak_tflops["tf32"] == pytest.approx(bf16 / 2)
    assert 0.5 < gpu.hbm_efficiency <= 1.0
    assert 0 < gpu.kernel_launch_s < 1e-5 and gpu.price_per_gpu_hour > 0
    for key in (
        "peak_tflops",
        "hbm_GiB",
        "hbm_TBps",
        "hbm_efficiency",
        "nvlink_GBps",
        "power_W",
        "price_per_gpu_hour",
        "kernel_launch_s",
        "gemm",
        "attention",
    ):
        assert gpu.sources.get(key), f"{name}: no source for {key}"
    assert gpu.hbm_Bps == pytest.approx(gpu.hbm_TBps * 1e12 * gpu.hbm_efficiency)


def test_fp8_is_twice_bf16_where_present_and_absent_on_a100():
    for name in NAMES[1:]:
        gpu = load_gpu(name)
        assert gpu.peak_tflops["fp8"] == pytest.approx(2 * gpu.peak_tflops["bf16"], rel=1e-3)
    a100 = load_gpu("A100-SXM-80GB")
    assert "fp8" not in a100.peak_tflops
    with pytest.raises(ConfigError, match="fp8"):
        a100.peak_flops("fp8")


def test_capacities_as_the_driver_reports_them():
    assert load_gpu("H100-SXM-80GB").hbm_GiB == pytest.approx(81559 / 1024, abs=0.01)
    assert load_gpu("H200-SXM-141GB").hbm_GiB == pytest.approx(143771 / 1024, abs=0.01)
    assert load_gpu("A100-SXM-80GB").hbm_bytes == 80 * 2**30


def test_specs_are_immutable_hashable_and_cached():
    gpu = load_gpu("H100-SXM-80GB")
    assert load_gpu("H100-SXM-80GB") is gpu
    assert {gpu: 1}[load_gpu("H100-SXM-80GB")] == 1
    with pytest.raises(AttributeError):
        gpu.hbm_GiB = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        gpu.peak_tflops["bf16"] = 1  # type: ignore[index]
    assert isinstance(load_gpu(gpu), GPUSpec)


def test_override_replaces_fields_and_merges_mappings():
    base = load_gpu("H100-SXM-80GB")
    gpu = load_gpu(
        {
            "base": "H100-SXM-80GB",
            "hbm_GiB": 94,
            "peak_tflops": {"bf16": 900},
            "gemm": {"eta": 0.5},
            "attention": {"bwd": {"eta": 0.4}},
        }
    )
    assert gpu.hbm_GiB == 94 and gpu.peak_tflops["bf16"] == 900
    assert gpu.peak_tflops["fp8"] == base.peak_tflops["fp8"]  # merged, not replaced
    assert gpu.gemm.eta == 0.5 and gpu.gemm.tiles == base.gemm.tiles
    assert gpu.attention.bwd.eta == 0.4 and gpu.attention.fwd == base.attention.fwd
    assert gpu.hbm_TBps == base.hbm_TBps and gpu.name == base.name
    assert gpu != base
    assert load_gpu({"base": "H100-SXM-80GB", "name": "H100-94"}).name == "H100-94"


def test_full_inline_mapping_uses_generic_kernel_parameters():
    gpu = load_gpu(
        {
            "name": "my-gpu",
            "peak_tflops": {"bf16": 500},
            "hbm_GiB": 64,
            "hbm_TBps": 2.5,
            "hbm_efficiency": 0.9,
            "nvlink_GBps": 200,
            "power_W": 500,
            "price_per_gpu_hour": 2.0,
            "kernel_launch_s": 2e-6,
        }
    )
    assert gpu.name == "my-gpu" and gpu.peak_flops("bf16") == 5e14
    assert gpu.gemm is not None and gpu.attention is not None and gpu.sm_count == 132


def test_unknown_name_gives_did_you_mean_and_the_list():
    with pytest.raises(ConfigError) as err:
        load_gpu("H100-SXM-80G", file="topo.yaml", field="topology.gpu")
    msg = str(err.value)
    assert "did you mean 'H100-SXM-80GB'" in msg
    assert all(n in msg for n in NAMES)
    assert err.value.field == "topology.gpu" and err.value.file == "topo.yaml"
    assert msg.startswith("topo.yaml: topology.gpu: ")
    for near in ("h100-sxm-80gb", "H100", "H100-SXM"):
        with pytest.raises(ConfigError, match="did you mean 'H100-SXM-80GB'"):
            load_gpu(near)
    with pytest.raises(ConfigError, match="field: gpu.base|unknown GPU") as err:
        load_gpu({"base": "H300"})
    assert err.value.field == "gpu.base"


def test_unknown_override_key_names_the_dotted_field():
    with pytest.raises(ConfigError) as err:
        load_gpu({"base": "H100-SXM-80GB", "hbm_gib": 94}, field="topology.gpu")
    assert err.value.field == "topology.gpu.hbm_gib"
    assert "did you mean 'hbm_GiB'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_gpu({"base": "H100-SXM-80GB", "gemm": {"etaa": 0.5}})
    assert err.value.field == "gpu.gemm.etaa"


@pytest.mark.parametrize(
    "override, field",
    [
        ({"hbm_efficiency": 1.5}, "gpu.hbm_efficiency"),
        ({"hbm_GiB": -1}, "gpu.hbm_GiB"),
        ({"nvlink_GBps": "fast"}, "gpu.nvlink_GBps"),
        ({"peak_tflops": {"int4": 10}}, "gpu.peak_tflops.int4"),
        ({"sm_count": 0}, "gpu.sm_count"),
        ({"gemm": {"tiles": [[128]]}}, "gpu.gemm.tiles"),
    ],
)
def test_invalid_values_are_config_errors(override, field):
    with pytest.raises(ConfigError) as err:
        load_gpu({"base": "H200-SXM-141GB", **override})
    assert err.value.field == field


def test_inline_mapping_missing_fields_is_a_config_error():
    with pytest.raises(ConfigError, match="lacks"):
        load_gpu({"peak_tflops": {"bf16": 100}})
    with pytest.raises(ConfigError, match="expected a GPU name or a mapping"):
        load_gpu(42)  # type: ignore[arg-type]


def test_b200_hbm_rate_is_its_bus_times_its_memory_clock():
    """A B200's HBM3e interface as the driver reports it: a 7,680-bit bus at 3,996 MHz, double
    data rate (pytorch/ao PR #4002), 7.672 TB/s; NVIDIA's HGX B200 table gives 7.7 TB/s; a
    streaming kernel moves bytes at that rate times the copy efficiency."""
    from simulator.hardware.compute import ComputeModel

    gpu = load_gpu("B200")
    assert gpu.hbm_TBps * 1e12 == pytest.approx(7680 / 8 * 3.996e9 * 2, rel=1e-3)
    assert round(gpu.hbm_TBps, 1) == 7.7
    cm = ComputeModel(gpu)
    assert cm.memory_s(1e9) == pytest.approx(1e9 / (7.672e12 * gpu.hbm_efficiency), rel=1e-3)
