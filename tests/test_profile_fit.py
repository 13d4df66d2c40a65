"""benchmarks/gpu/profile_fit.py's trace analysis on a synthetic chrome trace with known GPU gaps."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_profile_analysis_finds_the_gaps_and_what_the_host_did_in_them(tmp_path):
    """Catches a wrong busy share, gaps under 50 µs counted as waiting, overlapping kernels counted twice, or the
    idle time laid under the wrong Lightning action (the figures docs/gpu run 5 quotes come from here)."""
    spec = importlib.util.spec_from_file_location("profile_fit", ROOT / "benchmarks/gpu/profile_fit.py")
    pf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pf)

    def x(cat, ts, dur, name="k"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    events = [x("kernel", 0, 100), x("kernel", 150, 150), x("kernel", 100, 100),  # overlapping: busy 0-300
              x("kernel", 1300, 100), x("kernel", 1430, 70), x("gpu_memcpy", 1700, 100, "Memcpy DtoH"),
              x("user_annotation", 350, 500, "[pl][profile][Callback]SpeedMonitor.on_train_batch_end"),
              x("user_annotation", 1450, 300, "[pl][profile][_TrainingEpochLoop].train_dataloader_next"),
              x("gpu_user_annotation", 0, 1800, "[pl][profile]run_training_batch"),  # the GPU's copy: no host
              x("cuda_runtime", 400, 300, "cudaStreamSynchronize"), {"ph": "i", "name": "mark", "ts": 5}]
    r = pf.analyse({"traceEvents": events})
    assert (r["span_ms"], r["gpu_busy_ms"], r["gaps_over_50us"], r["gaps_total_ms"]) == (1.8, 0.57, 2, 1.2)
    assert [g["us"] for g in r["longest_gaps"]] == [1000.0, 200.0]  # 1400-1430 is launch latency
    assert r["longest_gaps"][0]["host_actions"] == [("[Callback]SpeedMonitor.on_train_batch_end", 500.0)]
    assert r["longest_gaps"][0]["runtime_calls"] == [("cudaStreamSynchronize", 300.0)]
    idle = {a["action"]: a["gpu_idle_under_ms"] for a in r["actions"]}
    assert idle == {"[Callback]SpeedMonitor.on_train_batch_end": 0.5, "[_TrainingEpochLoop].train_dataloader_next": 0.2}
    pf.write(r, tmp_path)
    assert "GPU busy 0.57 ms (31.7 %); 2 idle gaps" in (tmp_path / "profile.md").read_text()
    assert pf.analyse({"traceEvents": [x("cpu_op", 0, 10)]})["device_events"] == 0  # a CPU trace: a note
