"""Gradient accumulation and data parallelism give the gradient of the batch they stand for: a step's loss is the
MLM loss averaged over every masked token of the global batch plus the pair loss averaged over its sequences."""

import pytest
import torch
from safetensors.torch import load_file

from albert_hf import AlbertHFForPreTraining
from helpers import DDP, tiny_config
from pretraining_runs import metrics, pretrain_runs

pytestmark = pytest.mark.trains

STEPS = [
    "--max_train_steps",
    "10",
    "--eval_steps",
    "0",
    "--validation_split_percentage",
    "0",
    "--no_plots",
    "--mixed_precision",
    "no",
    "--logging_steps",
    "1",
]


def unequal_batch(vocab_size: int, seed: int = 0):
    """32 pairs of 24-128 tokens (padded to 128) whose masked counts differ a lot between groups of 8: the first 8
    have 2 masked tokens each, the last 8 have 20."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(24, 129, (32,), generator=generator)
    input_ids = torch.randint(5, vocab_size, (32, 128), generator=generator)
    attention_mask = (torch.arange(128) < lengths[:, None]).long()
    input_ids = input_ids * attention_mask
    token_type_ids = (torch.arange(128) > lengths[:, None] // 2).long() * attention_mask
    labels = torch.full((32, 128), -100)
    for row in range(32):
        count = [2, 6, 12, 20][row // 8]
        positions = torch.randperm(int(lengths[row]) - 2, generator=generator)[:count] + 1
        labels[row, positions] = input_ids[row, positions]
    order = torch.randint(0, 2, (32,), generator=generator)
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        labels=labels,
        sentence_order_label=order,
    )


def gradients(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.quick
@pytest.mark.parametrize("micro_batch", [8, 4])
@pytest.mark.rounding
def test_weighted_micro_batch_losses_sum_to_the_gradient_of_the_whole_batch(micro_batch):
    from accelerate import Accelerator

    from albert_hf.pretraining.training.step import loss_weights, weighted_loss

    torch.manual_seed(0)
    model = AlbertHFForPreTraining(tiny_config(vocab_size=300))
    batch = unequal_batch(300)
    model(**batch).loss.backward()  # the whole batch: means over its 320 masked tokens and its 32 pairs
    whole = gradients(model)
    model.zero_grad()

    micro_batches = [{k: v[i : i + micro_batch] for k, v in batch.items()} for i in range(0, 32, micro_batch)]
    accelerator = Accelerator(cpu=True)
    weights = loss_weights(micro_batches, accelerator, "global")
    for micro in micro_batches:
        weighted_loss(model(**micro), micro, weights).backward()
    accumulated = gradients(model)
    torch.testing.assert_close(accumulated, whole, rtol=1e-5, atol=1e-7)

    # what accumulating micro-batch means gives instead (the old behaviour): measurably another gradient
    model.zero_grad()
    for micro in micro_batches:
        (model(**micro).loss / len(micro_batches)).backward()
    mean_of_means = gradients(model)
    assert (mean_of_means - whole).norm() / whole.norm() > 0.02


def test_per_device_normalization_weights_each_processes_own_tokens(monkeypatch):
    from accelerate import Accelerator

    from albert_hf.pretraining.training.step import loss_weights

    batch = unequal_batch(300)
    micro_batches = [{k: v[i : i + 8] for k, v in batch.items()} for i in range(0, 32, 8)]
    accelerator = Accelerator(cpu=True)
    masked = sum(int((m["labels"] != -100).sum()) for m in micro_batches)
    assert masked == 8 * (2 + 6 + 12 + 20)
    weights = loss_weights(micro_batches, accelerator, "per_device").tolist()
    assert weights == pytest.approx([1 / masked, 1 / 32])
    # globally, each process's weights are scaled by the number of processes that DDP averages over
    monkeypatch.setattr(type(accelerator), "num_processes", property(lambda self: 4))
    monkeypatch.setattr(accelerator, "reduce", lambda tensor, reduction: tensor * 4)
    assert loss_weights(micro_batches, accelerator, "global").tolist() == pytest.approx([1 / masked, 1 / 32])


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory):
    """32 x 1 (the references) and 8 x 4 on one process, with LAMB and with AdamW: one process for the four."""
    root = tmp_path_factory.mktemp("accumulation")
    runs = {
        (batch, optimizer): root / f"{batch}x{32 // batch}-{optimizer}"
        for batch in (32, 8)
        for optimizer in ("lamb", "adamw")
    }
    results, _ = pretrain_runs(
        [
            (
                out,
                [
                    *STEPS,
                    "--optimizer",
                    optimizer,
                    "--per_device_train_batch_size",
                    str(batch),
                    "--gradient_accumulation_steps",
                    str(32 // batch),
                ],
            )
            for (batch, optimizer), out in runs.items()
        ]
    )
    assert [result["status"] for result in results] == [0] * 4, results
    return runs


# AdamW here has no bias correction and divides by sqrt(v) + 1e-6: for an element whose gradient is near zero, the
# fp32 summation-order difference between one batch of 32 and 4 x 8 is amplified up to the step size (lr 1e-2).
# Measured on a Xeon with AMX (AVX-512 fp32 kernels): 1.1e-5 at most after 10 steps, where an element can move 0.1.
ATOL = {"lamb": 1e-5, "adamw": 5e-5}


def check_same_weights(run, reference, optimizer):
    expected, got = load_file(reference / "model.safetensors"), load_file(run / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=ATOL[optimizer], msg=name)
    # the logged gradient norm is the whole batch's, whatever the split into processes and micro-batches: at the
    # first step (the same weights) within fp32 rounding, after it within what the weights differ by
    norms = [[row["grad_norm"] for row in metrics(folder)] for folder in (run, reference)]
    assert len(norms[0]) == len(norms[1]) == 10
    assert norms[0][0] == pytest.approx(norms[1][0], rel=1e-5)
    assert norms[0] == pytest.approx(norms[1], rel=1e-4)


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
@pytest.mark.rounding
def test_8x4_on_one_process_ends_with_the_weights_of_32x1(one_process_runs, optimizer):
    check_same_weights(one_process_runs[8, optimizer], one_process_runs[32, optimizer], optimizer)


TWO_PROCESSES = [(16, 1, "lamb"), (8, 2, "lamb"), (8, 2, "adamw")]


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """The three two-process runs in one launch."""
    root = tmp_path_factory.mktemp("two_processes")
    runs = {case: root / "{}x{}x2-{}".format(*case) for case in TWO_PROCESSES}
    results, _ = pretrain_runs(
        [
            (
                out,
                [
                    *STEPS,
                    "--optimizer",
                    optimizer,
                    "--per_device_train_batch_size",
                    str(per_device),
                    "--gradient_accumulation_steps",
                    str(accumulation),
                ],
            )
            for (per_device, accumulation, optimizer), out in runs.items()
        ],
        launcher=DDP,
    )
    assert [result["status"] for result in results] == [0] * 3, results
    return runs


@pytest.mark.parametrize("per_device, accumulation, optimizer", TWO_PROCESSES)
@pytest.mark.launched
@pytest.mark.rounding
def test_two_processes_end_with_the_weights_of_32x1(
    one_process_runs, two_process_runs, per_device, accumulation, optimizer
):
    check_same_weights(
        two_process_runs[per_device, accumulation, optimizer], one_process_runs[32, optimizer], optimizer
    )


# ----------------------------------------------------------------------------------------------------------------
# Fine-tuning: transformers' Trainer and its num_items_in_batch


def head_examples(head: str, count: int = 8):
    """`count` examples of 16 tokens with 4-16 real ones; token labels on a random part of the real tokens."""
    generator = torch.Generator().manual_seed(1)
    examples = []
    for i in range(count):
        length = int(torch.randint(4, 17, (1,), generator=generator))
        ids = torch.randint(5, 300, (16,), generator=generator) * (torch.arange(16) < length)
        mask = (torch.arange(16) < length).long()
        example = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(16, dtype=torch.long)}
        if head == "token_classification":
            labelled = (torch.rand(16, generator=generator) < (0.9 if i < count // 2 else 0.2)) & mask.bool()
            example["labels"] = torch.where(labelled, torch.randint(0, 3, (16,), generator=generator), -100)
        elif head == "multiple_choice":
            example = {key: value.repeat(4, 1) for key, value in example.items()}
            example["input_ids"] = torch.randint(5, 300, (4, 16), generator=generator) * mask  # 4 different choices
            example["labels"] = torch.tensor(i % 4)
        elif head == "question_answering":
            example["start_positions"] = torch.tensor(1)
            example["end_positions"] = torch.tensor(max(1, length - 2))
        else:
            example["labels"] = torch.tensor(i % 3)
        examples.append(example)
    return examples


HEADS = {
    "sequence_classification": "AlbertHFForSequenceClassification",
    "token_classification": "AlbertHFForTokenClassification",
    "multiple_choice": "AlbertHFForMultipleChoice",
    "question_answering": "AlbertHFForQuestionAnswering",
}


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.rounding
def test_trainer_accumulation_gives_the_whole_batch_step(tmp_path, head):
    """8 x 1 against 4 x 2 with SGD: the same weights. The token-level head takes Trainer's num_items_in_batch
    (its micro-batches hold 58 and 8 labelled tokens here); the others are means over examples, which Trainer's
    division by the accumulation steps makes the batch mean."""
    from transformers import Trainer, TrainingArguments

    import albert_hf

    model_class = getattr(albert_hf, HEADS[head])
    assert model_class.accepts_loss_kwargs == (head == "token_classification")
    examples = head_examples(head)
    weights = {}
    for batch, accumulation in ((8, 1), (4, 2)):
        torch.manual_seed(0)
        model = model_class(tiny_config(vocab_size=300, num_labels=3, classifier_dropout_prob=0.0))
        initial = {name: p.detach().clone() for name, p in model.named_parameters()}
        args = TrainingArguments(
            output_dir=str(tmp_path / f"{batch}x{accumulation}"),
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulation,
            max_steps=3,
            learning_rate=0.5,
            optim="sgd",
            lr_scheduler_type="constant",
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            seed=0,
            data_seed=0,
            disable_tqdm=True,
            max_grad_norm=0.0,
        )
        Trainer(model=model, args=args, train_dataset=examples).train()
        weights[batch] = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert max((weights[8][name] - initial[name]).abs().max() for name in initial) > 1e-3  # the steps moved them
    for name in weights[8]:
        torch.testing.assert_close(weights[4][name], weights[8][name], rtol=0, atol=1e-5, msg=lambda m: f"{name}: {m}")
