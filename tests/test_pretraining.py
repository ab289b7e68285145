"""run_pretraining.py end to end on the embedded corpus, with tiny models: the saved folder loaded without
albert_hf, two processes against one, streaming, NSP, fp16 loss scaling, the Hub push, the training counts."""

import json
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.pretraining.resolution import parse_args
from helpers import DDP, check_tokenizer_loads_without_prompt, run_python, tiny_config
from pretraining_runs import FAST, metrics, pretrain, pretrain_runs


@pytest.mark.trains
def test_end_to_end_run_saves_a_model_that_loads_without_albert_hf(tmp_path):
    out = tmp_path / "run"
    done = pretrain(out, "--max_train_steps", "6", "--eval_steps", "3", "--with_tracking")
    assert "Pretraining done." in done.stdout and "AutoModel -> AlbertHFModel" in done.stdout
    files = {p.name for p in out.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "README.md",
        "all_results.json",
        "modeling_albert_hf.py",
        "configuration_albert_hf.py",
        "metrics.jsonl",
        "fill_mask_examples.json",
    } <= files
    check_fill_mask_examples(out, done.stdout, held_out_texts(tmp_path))
    assert not any(name.startswith(".tmp") for name in files)
    rows = metrics(out)
    evals = [row for row in rows if "eval_mlm_accuracy" in row]
    assert [row["step"] for row in evals] == [3, 6]
    assert all(0 <= row["eval_sop_accuracy"] <= 1 and row["eval_mlm_loss"] > 0 for row in evals)
    assert any("train_mlm_loss" in row and "tokens_per_second" in row for row in rows)
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_mlm_accuracy"] == evals[-1]["eval_mlm_accuracy"]
    card = (out / "README.md").read_text()
    n_params = sum(t.numel() for t in load_file(out / "model.safetensors").values())
    assert "## Results" in card and "eval_mlm_accuracy" in card and "MLM" in card and "SOP" in card
    assert f"{n_params:,}" in card  # the tied decoder is stored once, so the file holds every parameter
    events = list((out / "runs").rglob("events.out.tfevents*"))
    assert events, "TensorBoard logs missing"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        scalars |= set(accumulator.Tags()["scalars"])
    # the run's cost and health beside its losses (no mfu: a CPU has no peak without --peak_tflops)
    assert {
        "train_mlm_loss",
        "model_tflops_per_second",
        "grad_norm",
        "data_wait",
        "peak_memory_gib",
        "total_model_flops",
        "mean_model_tflops_per_second",
    } <= scalars and "mfu" not in scalars, scalars
    loaded = run_python(
        "import transformers, sys\n"
        f"m = transformers.AutoModelForPreTraining.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        f"t = transformers.AutoTokenizer.from_pretrained({str(out)!r})\n"
        "enc = t('first part.', 'second part.', return_tensors='pt')\n"
        "print('TYPES', enc['token_type_ids'].tolist(), type(m).__name__, m(**enc).sop_logits.shape)\n",
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "AlbertHFForPreTraining torch.Size([1, 2])" in loaded.stdout and "1, 1" in loaded.stdout
    check_tokenizer_loads_without_prompt(out, fill_mask=True)


def held_out_texts(tmp_path):
    """The documents `pretrain` holds out of the embedded corpus (FAST's seed, the default 5%), single-spaced."""
    from albert_hf.pretraining.data.splits import hold_out_documents
    from data_fixtures import embedded

    args = parse_args(["--output_dir", str(tmp_path / "unused"), *FAST])
    _, held_out = hold_out_documents(embedded(), args.data.validation_split_percentage, args.optimization.seed)
    return [" ".join(text.split()) for text in held_out["text"]]


def check_fill_mask_examples(out, stdout, held_out):
    """The summary's fill-mask block and fill_mask_examples.json agree, and show held-out sentences, one masked
    content word each, with the model's top 5."""
    examples = json.loads((out / "fill_mask_examples.json").read_text())
    assert 3 <= len(examples) <= 5
    block = stdout.split("  fill-mask (held-out sentences; true word, then the model's top 5):\n")[1].splitlines()
    for example, line in zip(examples, block):
        assert set(example) == {"masked_sentence", "true_word", "predictions", "probabilities"}
        sentence, word = example["masked_sentence"], example["true_word"]
        assert sentence.split().count("[MASK]") == 1 and word.isalpha() and len(word) >= 4
        assert 8 <= len(sentence.split()) <= 30
        assert any(sentence.replace("[MASK]", word) in text for text in held_out), sentence  # never trained on
        assert len(example["predictions"]) == 5 and all(example["predictions"])
        assert example["probabilities"] == sorted(example["probabilities"], reverse=True)
        assert 0 < example["probabilities"][-1] and sum(example["probabilities"]) <= 1 + 1e-3
        assert line == f'    "{sentence}" — true: {word}; predicted: {" | ".join(example["predictions"])}'


@pytest.mark.trains
@pytest.mark.launched
@pytest.mark.rounding
def test_two_processes_and_accumulation_follow_the_same_loss_curve_as_one(tmp_path):
    args = ["--max_train_steps", "8", "--eval_steps", "0", "--validation_split_percentage", "0"]
    single, accumulated = tmp_path / "single", tmp_path / "accumulated"
    # same global batch: 2 processes x 4 = 1 process x 8 = 1 process x 4 x 2 accumulation steps (one process
    # for the two one-process runs; the curve is all they are compared by)
    results, _ = pretrain_runs(
        [
            (single, args),
            (accumulated, [*args, "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]),
        ]
    )
    assert [result["status"] for result in results] == [0, 0], results
    double = tmp_path / "double"
    done = pretrain(double, *args, "--per_device_train_batch_size", "4", launcher=DDP)
    assert "2 processes" in done.stderr
    one = metrics(single)
    for other in (metrics(double), metrics(accumulated)):
        check_same_curve(one, other)


def check_same_curve(one, two):
    assert [row["step"] for row in one] == [row["step"] for row in two] == [2, 4, 6, 8]
    for a, b in zip(one, two):
        # identical examples and masks; only DDP's mean of per-process MLM means differs from one global mean,
        # so the curves agree to ~1e-4 and an argmax near a tie may flip for a token or two
        assert b["train_mlm_loss"] == pytest.approx(a["train_mlm_loss"], rel=1e-3)
        assert b["train_sop_loss"] == pytest.approx(a["train_sop_loss"], rel=1e-3)
        assert b["train_mlm_accuracy"] == pytest.approx(a["train_mlm_accuracy"], abs=0.02)


@pytest.mark.trains
def test_streaming_jsonl_corpus(tmp_path, tiny_checkpoint):
    """--streaming reads the corpus lazily (an IterableDataset end to end) and still trains and evaluates."""
    from data_fixtures import embedded

    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w") as f:
        for row in embedded().select(range(1500)):
            f.write(json.dumps({"body": row["text"]}) + "\n")
    out = tmp_path / "run"
    done = pretrain(
        out,
        "--train_files",
        str(corpus),
        "--text_column",
        "body",
        "--streaming",
        "--tokenizer_name",
        str(tiny_checkpoint),
        "--max_train_steps",
        "4",
        "--eval_steps",
        "4",
    )
    assert "Pretraining done." in done.stdout
    rows = metrics(out)
    assert rows[-1]["step"] == 4 and "eval_mlm_accuracy" in rows[-1] and "eval_sop_accuracy" in rows[-1]
    # a stream holds out its first 100 documents (5% x 20): the fill-mask sentences come from those
    check_fill_mask_examples(out, done.stdout, [" ".join(row["text"].split()) for row in embedded().select(range(100))])


@pytest.mark.trains
def test_nsp_run_names_its_metrics_nsp(tmp_path, tiny_checkpoint):
    """With --task nsp the 2-way head's loss and accuracy are logged as nsp_*, never as sop_*."""
    out = tmp_path / "run"
    pretrain(
        out,
        "--task",
        "nsp",
        "--tokenizer_name",
        str(tiny_checkpoint),
        "--max_train_steps",
        "2",
        "--logging_steps",
        "1",
        "--eval_steps",
        "2",
    )
    rows = metrics(out)
    train, evals = [r for r in rows if "train_mlm_loss" in r], [r for r in rows if "eval_mlm_loss" in r]
    assert train and evals
    assert all("train_nsp_accuracy" in r and "train_nsp_loss" in r for r in train)
    assert all(0 <= r["eval_nsp_accuracy"] <= 1 for r in evals)
    assert not any(key.startswith(("train_sop", "eval_sop")) for r in rows for key in r)
    assert "eval_nsp_accuracy" in json.loads((out / "all_results.json").read_text())


@pytest.mark.trains
def test_fp16_overflow_skips_the_update_and_the_schedule_without_touching_weights(fresh_accelerate_state):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from albert_hf import AlbertHFForPreTraining
    from albert_hf.optimization import Lamb, get_official_schedule, parameter_groups
    from albert_hf.pretraining.training.step import training_step
    from albert_hf.runtime.hardware import enable_cpu_fp16

    def setup(init_scale):
        accelerator = Accelerator(cpu=True, mixed_precision="fp16")
        enable_cpu_fp16(accelerator)
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        torch.manual_seed(0)
        model = AlbertHFForPreTraining(tiny_config())
        optimizer = Lamb(parameter_groups(model), lr=1e-3)
        scheduler = get_official_schedule(optimizer, 0, 10)
        model, optimizer = accelerator.prepare(model, optimizer)
        return accelerator, model, optimizer, scheduler

    ids = torch.randint(5, 1000, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    batch = dict(input_ids=ids, labels=labels, sentence_order_label=torch.tensor([0, 1, 0, 1]))

    accelerator, model, optimizer, scheduler = setup(init_scale=2.0**100)  # every fp16 gradient overflows
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dtypes = []
    model.predictions.decoder.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    training_step(model, [batch], optimizer, scheduler, accelerator, max_grad_norm=1.0)
    assert dtypes == [torch.float16]  # fp16 autocast really ran
    assert accelerator.optimizer_step_was_skipped
    assert scheduler.last_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert accelerator.scaler.get_scale() < 2.0**100  # the scale backed off

    AcceleratorState._reset_state(True)
    accelerator, model, optimizer, scheduler = setup(init_scale=2.0**8)
    training_step(model, [batch], optimizer, scheduler, accelerator, max_grad_norm=1.0)
    assert not accelerator.optimizer_step_was_skipped and scheduler.last_epoch == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_push_to_hub_uploads_the_final_folder_without_step_checkpoints(tmp_path, fresh_accelerate_state):
    from huggingface_hub import HfApi, RepoUrl

    from albert_hf.pretraining.job import main

    uploads = []

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, repo_id, folder_path, commit_message=None, ignore_patterns=None, **kwargs):
        uploads.append(
            dict(
                repo_id=repo_id,
                files=sorted(p.name for p in Path(folder_path).iterdir()),
                message=commit_message,
                ignore=ignore_patterns,
            )
        )
        return mock.MagicMock(commit_url="https://huggingface.co/fake/commit")

    out = tmp_path / "run"
    with mock.patch.object(HfApi, "create_repo", create_repo), mock.patch.object(HfApi, "upload_folder", upload_folder):
        main(
            [
                "--output_dir",
                str(out),
                *FAST,
                "--max_train_steps",
                "4",
                "--checkpointing_steps",
                "2",
                "--eval_steps",
                "0",
                "--push_to_hub",
                "--hub_model_id",
                "someone/tiny-albert",
                "--hub_token",
                "x",
            ]
        )
    assert len(uploads) == 1 and uploads[0]["repo_id"] == "someone/tiny-albert"
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "modeling_albert_hf.py"} <= set(
        uploads[0]["files"]
    )
    assert "step_*" in uploads[0]["ignore"] and (out / "step_2").is_dir()  # present locally, not uploaded


def test_running_metric_counts_hold_no_autograd_graph():
    """The training loop adds every step's counts into one window; a graph attached to them kept each step's
    logits alive (the process grew ~30 MB a step until the machine ran out of memory)."""
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.pretraining.training.evaluation import example_counts
    from albert_hf.pretraining.training.step import step_counts

    model = AlbertHFForPreTraining(tiny_config()).train()
    input_ids = torch.randint(5, 1000, (4, 16))
    labels = torch.full_like(input_ids, -100)
    labels[:, 3::4] = input_ids[:, 3::4]
    batch = dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        labels=labels,
        sentence_order_label=torch.tensor([0, 1, 0, 1]),
    )
    outputs = model(**batch)
    outputs.loss.backward()
    for counts in (example_counts(outputs, batch).sum(0), step_counts(outputs, batch)):
        window = torch.zeros(6, dtype=torch.float64)
        window += counts
        assert not window.requires_grad and window.grad_fn is None
        assert window[2] == 16 and window[5] == 4  # 4 masked tokens and one SOP label per example


def test_training_counts_from_the_model_losses_equal_the_per_token_recount():
    """Training sums the model's own mean losses times their counts; evaluation recounts per token: the same."""
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.pretraining.training.evaluation import example_counts
    from albert_hf.pretraining.training.step import step_counts

    model = AlbertHFForPreTraining(tiny_config()).eval()
    input_ids = torch.randint(5, 1000, (6, 24))
    labels = torch.full_like(input_ids, -100)
    labels[:, 2::5] = input_ids[:, 2::5]
    labels[0, :] = -100  # an example without masked tokens
    batch = dict(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        labels=labels,
        sentence_order_label=torch.tensor([0, 1, 1, 0, 1, 0]),
    )
    with torch.no_grad():
        outputs = model(**batch)
    recount, counts = example_counts(outputs, batch).sum(0), step_counts(outputs, batch)
    assert counts[2] == 25 and counts[5] == 6
    torch.testing.assert_close(counts, recount, rtol=1e-6, atol=1e-6)
    assert counts[0] > 25 * 4  # a near-random model over 1000 pieces: several nats per token, not a mean
