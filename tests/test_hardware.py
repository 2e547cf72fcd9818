"""The hardware table: what torch reports for each card, the cards issue 24 asked for, the JSON format
of ``estimator hardware --format json`` and ``--gpu FILE.json`` for a card the table lacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from estimator.errors import UserError
from estimator.hardware import GPUS, H100_RATIO, MiB, gpu_links, lookup, match_device_name

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"name", "memory_gb", "total_memory_bytes", "bandwidth_gbs", "peak_tflops", "arch", "sms", "clock_mhz",
          "tdp_w"}


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "estimator", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_the_cards_issue_24_asked_for():
    names = {g.name for g in GPUS}
    assert {"T4", "A10G", "L40", "RTX-A6000", "V100-16GB", "H800", "H20", "GH200", "MI250X", "H100-NVL",
            "A100-80GB-PCIe", "A100-40GB-PCIe", "V100-PCIe", "H100-PCIe"} <= names
    for g in GPUS:
        assert g.sms and g.tdp_w and g.total_memory and g.total_memory_source, g.name


def test_capacity_is_what_torch_reports():
    """Printouts of torch / deviceQuery (estimator/hardware.py cites each): A100-SXM4-80GB 81,051 MiB, T4
    15,109 MiB, L4 22,518 MiB, RTX 4090 24,564 MiB; the H100 of tests/data/cuda_reference 81,079 MiB."""
    assert lookup("A100-80GB").capacity == 81051 * MiB
    assert lookup("T4").capacity == 15109 * MiB
    assert lookup("L4").capacity == 22518 * MiB
    assert lookup("RTX4090").capacity == 24564 * MiB
    assert lookup("H100").capacity == 81079 * MiB
    # a card without a printout: the datasheet x the H100's ratio (81,079 MiB of 80 GB), and it says so
    nvl = lookup("H100-NVL")
    assert nvl.capacity == int(94e9 * H100_RATIO) and "not measured" in nvl.total_memory_source
    # the datasheet's decimal gigabytes understated the A100-80GB by 79.15 / 74.51 - 1 = 6.2 %
    a100 = lookup("A100-80GB")
    assert a100.capacity / a100.memory == pytest.approx(81051 * MiB / 80e9)


def test_device_names_of_the_variants():
    assert match_device_name("NVIDIA A100 80GB PCIe").name == "A100-80GB-PCIe"
    assert match_device_name("NVIDIA A100-PCIE-40GB").name == "A100-40GB-PCIe"
    assert match_device_name("Tesla V100-PCIE-32GB").name == "V100-PCIe"
    assert match_device_name("Tesla V100-SXM2-16GB").name == "V100-16GB"
    assert match_device_name("Tesla T4").name == "T4"
    assert match_device_name("NVIDIA H100 PCIe").name == "H100-PCIe"


def test_hardware_json_round_trips_through_gpu_file(tmp_path):
    proc = _cli("hardware", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    entries = json.loads(proc.stdout)
    assert [e["name"] for e in entries] == [g.name for g in GPUS]
    assert all(FIELDS <= set(e) for e in entries)
    entry = next(e for e in entries if e["name"] == "RTX-A6000")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(entry | {"name": "My-A6000"}))
    mine, table = lookup(str(path)), lookup("RTX-A6000")
    assert (mine.name, mine.capacity, mine.bandwidth, mine.peak, mine.arch, mine.sms, mine.tdp_w) == (
        "My-A6000", table.capacity, table.bandwidth, table.peak, table.arch, table.sms, table.tdp_w)
    assert gpu_links(mine) == gpu_links(table)  # a renamed copy keeps its system's links


def test_gpu_file_links_are_the_planners():
    """A renamed copy of an SXM card keeps NVLink inside the node (it took PCIe 4, the default of a card the table
    lacks, before the file carried its links); a file may name other links."""
    from estimator.hardware import LINKS, gpu_from_json

    entry = lookup("H100").to_json() | {"name": "H100-96GB", "aliases": []}
    assert [lk.name for lk in gpu_links(gpu_from_json(entry))] == ["nvlink4", "pcie5", "ib-ndr"]
    entry["links"] = {"intra_node": "pcie5", "inter_node": "eth-100g"}  # host: the default
    assert gpu_links(gpu_from_json(entry)) == (LINKS["pcie5"], LINKS["pcie4"], LINKS["eth-100g"])
    del entry["links"]
    assert gpu_links(gpu_from_json(entry))[0] == LINKS["pcie4"]


@pytest.mark.parametrize("text, message", [
    ("{", "not valid JSON"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": 768}', "missing field 'peak_tflops'"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": 768, "peak_tflops": {"fp32": 38.7}, "sm": 84}',
     "unknown field 'sm'; did you mean 'sms'"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": "fast", "peak_tflops": {"fp32": 38.7}}', "bandwidth_gbs must"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": 768, "peak_tflops": {"fp64": 1}}', "unknown dtype 'fp64'"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": 768, "peak_tflops": {"fp32": 38.7}, "total_memory_bytes": 48}',
     "give bytes"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": 768, "peak_tflops": {"fp32": 38.7}, '
     '"links": {"intra_node": "nvlink9"}}', "links.intra_node must be one of"),
    ('{"name": "x", "memory_gb": 48, "bandwidth_gbs": 768, "peak_tflops": {"fp32": 38.7}, '
     '"links": {"intra": "nvlink4"}}', "links has unknown key 'intra'"),
])
def test_gpu_file_errors_are_one_line(tmp_path, text, message):
    path = tmp_path / "gpu.json"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as info:
        lookup(str(path))
    assert "\n" not in str(info.value)


def test_cli_gpu_file_error_exits_2_without_traceback(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text('{"name": "x", "memory_gb": 48}')
    proc = _cli("estimate", "examples/mlp.py:build", "--gpu", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "missing field 'bandwidth_gbs'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_cli_estimate_on_a_described_card(tmp_path):
    """A card the table lacks: its memory verdict and an extrapolated step time with its likely range."""
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(lookup("RTX-A6000").to_json() | {"name": "Workstation-X"}))
    proc = _cli("estimate", "examples/mlp.py:build", "--gpu", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["fit"]["gpu"] == "Workstation-X" and d["fit"]["capacity"] == lookup("RTX-A6000").capacity
    st = d["step_time"]
    assert st["likely_s"][0] < st["total_s"] < st["likely_s"][1]
    assert st["band_note"].startswith("extrapolated: no kernel measurements")


def test_unknown_name_mentions_the_file_option():
    with pytest.raises(UserError, match="FILE.json"):
        lookup("H10")


def test_step_time_range_in_text_json_and_html():
    """Every predicted step time carries its likely range and what it rests on, in every format."""
    import examples.mlp as mlp

    from estimator import estimate

    model, inputs = mlp.build()
    r = estimate(model, inputs, gpu="T4", solve_batch=False)
    st = r.step_time
    assert st.likely[0] < st.total < st.likely[1]
    assert "calibrated on fp32 kernels measured on this GPU" in st.band_note
    assert ", likely " in str(r) and ", likely " in r.to_html()
    d = r.to_dict()["step_time"]
    assert d["likely_s"] == list(st.likely) and d["band_note"] == st.band_note
