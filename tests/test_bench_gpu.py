"""benchmarks/bench_gpu.py: its FLOP count against torch's own counter, its peak table, and its run on the CPU."""

import json
import sys
import warnings

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

import bench_gpu
import profile_gpu
from albert_hf import AlbertHFForPreTraining
from bench_model import albert_flops
from helpers import REPO, run_bounded, subprocess_env, tiny_config


def counted_step_flops(model, batch: int, seq: int, masked: int) -> int:
    """FLOPs torch counts for one forward and backward, with `masked` labelled positions a sequence (from 1 on)."""
    ids = torch.randint(5, model.config.vocab_size, (batch, seq))
    labels = torch.full_like(ids, -100)
    labels[:, 1 : 1 + masked] = ids[:, 1 : 1 + masked]
    with FlopCounterMode(display=False) as counter:
        order = torch.zeros(batch, dtype=torch.long)
        loss = model(input_ids=ids, labels=labels, sentence_order_label=order).loss
        loss.backward()
    return counter.get_total_flops()


def test_executed_flops_are_what_torch_counts_for_transformers_albert():
    # transformers' MLM head runs at every position, whatever the labels: that is what it executes
    config = tiny_config()
    theirs = transformers.AlbertForPreTraining(config.to_albert_config()).train()
    theirs.set_attn_implementation("eager")  # FlopCounterMode does not count SDPA's CPU kernel; eager's matmuls it does
    batch, seq, masked = 3, 16, 4
    assert bench_gpu.executed_flops(config, batch, seq, "transformers") == albert_flops(
        config, batch, seq, masked_per_seq=20, mlm_rows_per_seq=seq
    )
    assert albert_flops(config, batch, seq, masked, mlm_rows_per_seq=seq) == counted_step_flops(
        theirs, batch, seq, masked
    )


@pytest.mark.parametrize("groups", [{}, {"num_hidden_groups": 2, "inner_group_num": 2, "num_hidden_layers": 4}])
@pytest.mark.parametrize("masked", [4, 15])
def test_flop_count_is_what_torch_counts_for_the_positions_albert_hf_computes(groups, masked):
    config = tiny_config(**groups)
    model = AlbertHFForPreTraining(config).train()
    batch, seq = 3, 16
    # The last layer computes the masked positions and the first (the pooler's): masked + 1 query rows.
    assert albert_flops(config, batch, seq, masked, last_layer_queries=masked + 1) == counted_step_flops(
        model, batch, seq, masked
    )
    # The model's count (what MFU divides) has the last layer at every position: more whenever positions are skipped.
    skipped = seq - (masked + 1)
    assert (albert_flops(config, batch, seq, masked) > albert_flops(config, batch, seq, masked, masked + 1)) == (
        skipped > 0
    )


@pytest.mark.parametrize(
    "name, peak, tf32",
    [
        ("NVIDIA H100 80GB HBM3", 989.0, 494.5),
        ("NVIDIA H100 PCIe", 756.0, 378.0),
        ("NVIDIA H100 NVL", 835.0, 417.5),
        ("NVIDIA H200", 989.0, 494.5),
        ("NVIDIA H200 NVL", 835.0, 417.5),
        ("NVIDIA A100-SXM4-80GB", 312.0, 156.0),
        ("NVIDIA L4", 121.0, 60.0),
        ("NVIDIA L40S", 362.0, 183.0),
        ("Tesla T4", 65.0, 8.1),
        ("Tesla V100-SXM2-32GB", 125.0, 15.7),
        ("Tesla V100-PCIE-32GB", 112.0, 14.0),
        ("NVIDIA GeForce RTX 4090", None, None),
    ],
)
def test_spec_peak_is_read_by_device_name_and_mode(monkeypatch, name, peak, tf32):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert bench_gpu.spec_peak(torch.device("cuda")) == peak
    assert bench_gpu.spec_peak(torch.device("cuda"), "fp32") == tf32
    assert bench_gpu.spec_peak(torch.device("cpu")) is None


def warns_of_syncs(times: int):
    def run():
        for _ in range(times):
            warnings.warn("called a synchronizing CUDA operation")

    return run


@pytest.mark.parametrize("planted, reported", [(1, 3), (0, None), (2, None)])
def test_host_syncs_are_reported_only_once_a_planted_item_read_one(monkeypatch, planted, reported):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    counted = bench_gpu.host_syncs(warns_of_syncs(3), torch.device("cuda"), planted=warns_of_syncs(planted))
    assert counted == {"host_syncs_per_step": reported, "planted_item_counted": planted}


@pytest.mark.parametrize(
    "kernel, group",
    [
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "GEMM"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "GEMM"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
        ("void pytorch_flash::flash_fwd_kernel", "attention"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<LpNormFunctor>", "optimizer and clipping"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", "copies and memsets"),
        ("Memset (Device)", "copies and memsets"),
        (
            "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float>",
            "elementwise / LayerNorm / GELU",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<8, at::native::GeluBackwardCUDAKernelImpl",
            "elementwise / LayerNorm / GELU",
        ),
        ("void at::native::cunn_SoftMaxForward<8, float>", "loss"),
        ("some_other_kernel", "other"),
    ],
)
def test_profile_groups_kernels_by_name(kernel, group):
    assert profile_gpu.group_of(kernel) == group


def test_profile_leaves_out_the_ranges_torch_marks_on_the_gpu_but_keeps_kernels_with_lambdas():
    assert profile_gpu.GPU_RANGE.match("Optimizer.step#Lamb.step") and profile_gpu.GPU_RANGE.match("ProfilerStep#3")
    assert not profile_gpu.GPU_RANGE.match(
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_"
        "kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()()"
    )
    assert not profile_gpu.GPU_RANGE.match("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")


def test_profile_idle_is_the_span_less_the_union_of_kernels():
    # overlapping and nested intervals count once: busy 0-15 and 20-30, so 25 of a span of 30
    assert profile_gpu.busy_union([(20, 30), (0, 10), (5, 15), (22, 25)]) == 25
    assert profile_gpu.busy_union([]) == 0


def test_profile_of_the_default_step_is_the_compiled_model_captured_whole(monkeypatch):
    # what run_pretraining.py runs on a GPU with no flag; the capture itself needs CUDA, so it is recorded here
    captured = []
    monkeypatch.setattr(bench_gpu.Runner, "capture", lambda self, batch, dtype: captured.append((self, batch)) or self)
    config, runners = bench_gpu.build("base", 16, torch.device("cpu"))
    batch = {"input_ids": torch.zeros(2, 16, dtype=torch.long)}
    runner = profile_gpu.runner_for(profile_gpu.DEFAULT, runners, batch, torch.bfloat16)
    assert captured == [(runner, batch)] and runner.compile_mode == "default"
    assert runner.model is not runners["albert_hf"].model and runner.model.albert.encoder.blocks_compiled
    assert profile_gpu.runner_for("albert_hf", runners, batch, torch.bfloat16) is runners["albert_hf"]
    assert not runners["albert_hf"].model.albert.encoder.blocks_compiled  # eager stays eager


@pytest.mark.launched
def test_the_ddp_graph_check_runs_its_three_forms_alike_on_cpus(tmp_path):
    # its GPU run is gpu_extra.sh's; here 2 processes over gloo, the graph a stand-in: the script's plumbing
    out = tmp_path / "ddp_graph.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(REPO / "benchmarks" / "check_ddp_graph.py"),
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--shape",
        "4x32",
        "--steps",
        "3",
        "--windows",
        "1",
        "--window_steps",
        "2",
        "--out",
        str(out),
    ]
    done = run_bounded(command, 240, env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and set(report["step_ms"]) == {"ddp eager", "ddp graph", "graph"}
    assert max(report["largest_relative_difference"].values()) < 1e-5
    assert len(set(report["losses"]["ddp eager"])) == 3  # it trained: a new loss each step


def test_shapes_parse():
    assert bench_gpu.Shape.parse("base:32x512") == bench_gpu.Shape("base", 32, 512)
    assert bench_gpu.Shape.parse("xxlarge:auto:512") == bench_gpu.Shape("xxlarge", None, 512)


@pytest.mark.trains
def test_bench_gpu_runs_on_the_cpu_and_writes_every_shape(tmp_path, capsys):
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as done:
        bench_gpu.main(
            [
                "--device",
                "cpu",
                "--mode",
                "fp32",
                "--shapes",
                "tiny:4x32",
                "tiny:auto:32",
                "--warmup",
                "1",
                "--windows",
                "2",
                "--window_steps",
                "1",
                "--max_auto_batch",
                "16",
                "--out",
                str(out),
            ]
        )
    assert done.value.code == 0
    report = json.loads(out.read_text())
    fixed, searched = report["shapes"]
    assert (fixed["batch"], fixed["seq"], fixed["largest_batch_searched"]) == (4, 32, False)
    assert (searched["batch"], searched["largest_batch_searched"]) == (16, True)  # the tiny model fits all 3 tries
    for row in report["shapes"]:
        for name in ("transformers", "albert_hf"):
            cell = row[name]
            assert cell["tokens_per_s"] > 0 and cell["step_ms"] > 0
            assert 0 < cell["mfu_gemm"] and cell["mfu_spec"] is None  # a CPU has no spec peak in the table
            executed = bench_gpu.executed_flops(tiny_config(), row["batch"], row["seq"], name)
            assert cell["tflops_executed"] == pytest.approx(cell["tflops"] * executed / row["flops_per_step"])
        # transformers runs SDPA's CPU kernel; albert_hf's CPU training path computes short attention as matmuls
        assert row["transformers"]["attention"] == ["flash (CPU)"]
        assert row["albert_hf"]["attention"] == ["matmul + softmax"]
        assert row["ratio"] == pytest.approx(row["albert_hf"]["tokens_per_s"] / row["transformers"]["tokens_per_s"])
        assert 0 < row["albert_hf"]["update_share"] < 1
        assert row["flops_per_step"] == albert_flops(tiny_config(), row["batch"], row["seq"])
    table = capsys.readouterr().out.splitlines()
    assert table[-1].startswith("| tiny 16 x 32 | albert_hf |") and table[-6].startswith("| shape |")
    assert table[-7].startswith("albert_hf's clipping and LAMB update, share of the step: tiny 4 x 32 ")


def test_bench_gpu_without_a_gpu_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        bench_gpu.main(["--device", "cuda"])
    assert "torch sees no CUDA device" in str(stop.value.code)


def test_bench_input_times_the_gpu_loader_at_each_shape_against_bench_gpu(tmp_path, capsys):
    import bench_input

    gpu = tmp_path / "gpu.json"  # what bench_gpu.py writes, cut to the fields read
    gpu.write_text(
        json.dumps({"shapes": [{"preset": "tiny", "batch": 4, "seq": 32, "albert_hf": {"tokens_per_s": 1000.0}}]})
    )
    out = tmp_path / "input.json"
    bench_input.main(
        [
            "--shapes",
            "tiny:4x32",
            "tiny:8x64",
            "--workers",
            "0",
            "--batches",
            "3",
            "--vocab_size",
            "800",
            "--gpu_json",
            str(gpu),
            "--out",
            str(out),
        ]
    )
    first, second = json.loads(out.read_text())["shapes"]
    assert (first["batch"], first["seq"], second["batch"], second["seq"]) == (4, 32, 8, 64)
    assert first["loader_tokens_per_s"] > 0 and first["ratio"] == pytest.approx(first["loader_tokens_per_s"] / 1000)
    assert second["gpu_tokens_per_s"] is None and second["ratio"] is None  # no GPU figure for that shape
    table = capsys.readouterr().out.splitlines()
    assert table[-2].startswith("| tiny 4 x 32 | ") and table[-1].endswith("| - | - |")
