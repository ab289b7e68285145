"""The pretraining job behind `run_pretraining.py`: accelerate, LAMB, exact resume, evaluation, Hub push.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 ...
    python run_pretraining.py            # a tiny ALBERT on the embedded corpus, a few minutes on a laptop CPU

Loop: MLM + SOP loss (their plain sum), LAMB with the official poly-decay schedule, global clipping at 1.0,
gradient accumulation, bf16/fp16 through accelerate. Every `--checkpointing_steps` the full state (model,
optimizer, scheduler, RNGs, data position) goes atomically into `OUTPUT_DIR/step_N`;
`--resume_from_checkpoint latest` continues exactly where the last complete checkpoint left off.
"""

import argparse
import json
import logging
import os
import re
import shutil
import time
from itertools import islice
from pathlib import Path

import torch

logger = logging.getLogger("albert_hf.pretraining")

STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "training_state.json"  # written last: a step_N folder without it is not a checkpoint
FILL_MASK_FILE = "fill_mask_examples.json"  # the summary's fill-mask examples (all_results.json: metrics only)


# ----------------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Pretrain ALBERT (MLM + sentence-order prediction) with accelerate. With no arguments: a tiny "
        "ALBERT on the embedded corpus (standard-library docstrings) for a few minutes.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    model = parser.add_argument_group("model")
    model.add_argument("--model_config", default="tiny",
                       help="preset: tiny | base | large | xlarge | xxlarge (official v2 dimensions)")
    model.add_argument("--config_name", default=None,
                       help="a config.json path or directory (overrides --model_config)")
    model.add_argument("--model_name_or_path", default=None,
                       help="continue pretraining from these weights (albert_hf or transformers ALBERT)")
    model.add_argument("--sharing", default=None, choices=["all", "attention", "ffn", "none"],
                       help="override the config's cross-layer sharing (the paper's Table 4 ablation)")
    model.add_argument("--tokenizer_name", default=None,
                       help="tokenizer directory or Hub name; default: train a SentencePiece unigram model on the "
                       "training corpus (cached)")
    model.add_argument("--vocab_size", type=int, default=4000,
                       help="vocabulary size when training the tokenizer (the official models use 30000)")
    model.add_argument("--gradient_checkpointing", action="store_true", help="recompute activations in backward")
    model.add_argument("--torch_compile", action="store_true",
                       help="torch.compile each transformer block (`compile_blocks`): one graph for all shared layer "
                       "applications, compiled in seconds; padding removal and the last-block selection stay on")

    data = parser.add_argument_group("data")
    data.add_argument("--train_files", nargs="+", default=None,
                      help="text files or folders (.txt), or json/jsonl/parquet/csv files with a text column")
    data.add_argument("--dataset_name", default=None, help="a datasets Hub name, e.g. wikitext (needs network)")
    data.add_argument("--dataset_config_name", default=None, help="e.g. wikitext-103-raw-v1")
    data.add_argument("--text_column", default="text")
    data.add_argument("--layout", default="document_per_file",
                      choices=["document_per_file", "blank_line_separated", "sentence_per_line"],
                      help="how plain-text files hold documents (sentence_per_line = official format)")
    data.add_argument("--streaming", action="store_true", help="stream the corpus instead of materialising it")
    data.add_argument("--validation_split_percentage", type=float, default=5.0,
                      help="documents held out for evaluation")
    data.add_argument("--max_seq_length", type=int, default=128, help="official: 512")
    data.add_argument("--short_seq_prob", type=float, default=0.1)
    data.add_argument("--dupe_factor", type=int, default=5, help="static epochs of pairs (official: 40)")
    data.add_argument("--task", default="sop", choices=["sop", "nsp", "none"],
                      help="inter-sentence objective: sentence order (ALBERT), next sentence (BERT) or none")
    data.add_argument("--mlm_probability", type=float, default=0.15)
    data.add_argument("--max_ngram", type=int, default=3)
    data.add_argument("--max_predictions_per_seq", type=int, default=20)
    data.add_argument("--preprocessing_num_workers", type=int, default=None)

    train = parser.add_argument_group("training")
    train.add_argument("--per_device_train_batch_size", type=int, default=32)
    train.add_argument("--per_device_eval_batch_size", type=int, default=64)
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--optimizer", default="lamb", choices=["lamb", "adamw"],
                       help="lamb: official TF LAMB; adamw: official AdamWeightDecay (no bias correction)")
    train.add_argument("--learning_rate", type=float, default=1e-2,
                       help="peak LR; the default suits the tiny demo model (the paper: 0.00176 for batch 4096)")
    train.add_argument("--weight_decay", type=float, default=0.01)
    train.add_argument("--adam_beta1", type=float, default=0.9, help="first-moment decay (official: 0.9)")
    train.add_argument("--adam_beta2", type=float, default=0.999,
                       help="second-moment decay (official: 0.999). Neither optimizer corrects the moments' bias, so "
                       "for the first ~1/(1-beta2) steps the LayerNorm and bias parameters (no trust ratio) move "
                       "several times lr per step; with a warm-up much shorter than that, deeper models can stall "
                       "for hundreds of steps. Short runs: 0.98, or a longer --num_warmup_steps")
    train.add_argument("--adam_epsilon", type=float, default=1e-6, help="official: 1e-6")
    train.add_argument("--max_grad_norm", type=float, default=1.0)
    train.add_argument("--max_train_steps", type=int, default=1500)
    train.add_argument("--num_warmup_steps", type=int, default=None,
                       help="default: 2.5%% of --max_train_steps, the official ratio (3125 of 125k)")
    train.add_argument("--mixed_precision", default=None, choices=["no", "fp16", "bf16"],
                       help="default: accelerate's configuration (bf16 is the fast path on CPUs with AMX)")
    train.add_argument("--seed", type=int, default=12345)

    io = parser.add_argument_group("evaluation, checkpoints and output")
    io.add_argument("--output_dir", default="outputs/albert-pretraining")
    io.add_argument("--eval_steps", type=int, default=500, help="evaluate every N optimizer steps (0: only at the end)")
    io.add_argument("--max_eval_samples", type=int, default=2000)
    io.add_argument("--logging_steps", type=int, default=20)
    io.add_argument("--checkpointing_steps", type=int, default=None, help="save full training state every N steps")
    io.add_argument("--checkpoints_total_limit", type=int, default=None, help="keep only the newest N step_ folders")
    io.add_argument("--resume_from_checkpoint", default=None,
                    help="'latest' (the newest complete step_N in --output_dir, or a fresh start when there is none) "
                    "or a step_N folder")
    io.add_argument("--overwrite_output_dir", action="store_true",
                    help="start over in an --output_dir that holds an earlier run: its checkpoints, logs, results "
                    "and model are deleted first (without this flag, such a folder is refused)")
    io.add_argument("--with_tracking", action="store_true", help="log to the trackers of --report_to")
    io.add_argument("--report_to", default="tensorboard", help="accelerate tracker(s): tensorboard, wandb, all, ...")
    io.add_argument("--push_to_hub", action="store_true")
    io.add_argument("--hub_model_id", default=None, help="repo id (default: the output_dir name)")
    io.add_argument("--hub_token", default=None)
    io.add_argument("--license", default=None,
                    help="the license named in the model card, a Hub license id (e.g. apache-2.0)")
    io.add_argument("--trust_remote_code", action="store_true")
    return parser


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.train_files and args.dataset_name:
        raise SystemExit("error: pass --train_files or --dataset_name, not both")
    for name in ("max_train_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_seq_length"):
        if getattr(args, name) < 1:
            raise SystemExit(f"error: --{name} must be at least 1")
    from .configuration_albert_hf import PRESETS

    if not args.config_name and not args.model_name_or_path and args.model_config not in PRESETS:
        raise SystemExit(f"error: Unknown ALBERT preset {args.model_config!r}; choose one of {sorted(PRESETS)} "
                         "or pass --config_name")
    for path in args.train_files or ():
        if not Path(path).exists():
            raise SystemExit(f"error: --train_files: {path} does not exist")
    if args.num_warmup_steps is None:
        args.num_warmup_steps = round(0.025 * args.max_train_steps)
    if args.num_warmup_steps > args.max_train_steps:
        raise SystemExit("error: --num_warmup_steps exceeds --max_train_steps")
    if not 0 <= args.validation_split_percentage < 100:
        raise SystemExit("error: --validation_split_percentage must be in [0, 100)")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            raise SystemExit(f"error: --{name} must be in [0, 1)")
    if args.resume_from_checkpoint and args.overwrite_output_dir:
        raise SystemExit("error: pass --resume_from_checkpoint or --overwrite_output_dir, not both")
    if args.resume_from_checkpoint not in (None, "latest"):
        problem = StepCheckpoints.problem(Path(args.resume_from_checkpoint))
        if problem:
            raise SystemExit(f"error: --resume_from_checkpoint {args.resume_from_checkpoint}: {problem}")
    earlier = previous_run_files(args.output_dir)
    if earlier and not args.overwrite_output_dir:
        has_checkpoint = bool(StepCheckpoints.complete_in(args.output_dir))
        if args.resume_from_checkpoint is None:
            resumable = ("pass --resume_from_checkpoint latest to continue it" if has_checkpoint
                         else "it left no complete step_N checkpoint for --resume_from_checkpoint latest")
            raise SystemExit(f"error: --output_dir {args.output_dir} holds an earlier run ({', '.join(earlier[:4])}"
                             f"{', ...' if len(earlier) > 4 else ''}): {resumable}; pass --overwrite_output_dir to "
                             "start over, or another --output_dir")
        if args.resume_from_checkpoint == "latest" and not has_checkpoint:
            raise SystemExit(f"error: --resume_from_checkpoint latest: --output_dir {args.output_dir} holds an "
                             "earlier run but no complete step_N checkpoint to continue from; pass "
                             "--overwrite_output_dir to start over, or another --output_dir")
    return args


# What a run writes into --output_dir: an earlier run is recognised (and, with --overwrite_output_dir, cleared)
# by these names only, so unrelated files a user keeps there are neither a reason to refuse nor deleted.
RUN_OUTPUTS = ("step_*", ".tmp-*", "runs", "metrics.jsonl", "all_results.json", "README.md", "config.json",
               "model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "spiece.model", "configuration_albert_hf.py",
               "modeling_albert_hf.py", FILL_MASK_FILE)


def previous_run_files(output_dir) -> list[str]:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted({path.name for pattern in RUN_OUTPUTS for path in output_dir.glob(pattern)})


def truncate_metrics_log(path: Path, step: int) -> None:
    """Keep the rows up to `step`: a resumed run logs the later ones again. A row cut short by a kill is dropped."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", 0) <= step:
            kept.append(line + "\n")
    path.write_text("".join(kept))


def clear_previous_run(output_dir) -> list[str]:
    """Delete what an earlier run wrote into output_dir (for --overwrite_output_dir); returns the names."""
    names = previous_run_files(output_dir)
    for name in names:
        path = Path(output_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return names


# ----------------------------------------------------------------------------------------------------------------
# Step checkpoints, written atomically


class StepCheckpoints:
    """`output_dir/step_N` folders holding accelerate's full state plus `training_state.json`.

    A checkpoint is written into `.tmp-step_N` and renamed when complete, so a kill at any moment leaves the
    previous checkpoints untouched and never a half-written `step_N`.
    """

    def __init__(self, output_dir, accelerator, total_limit=None):
        self.output_dir = Path(output_dir)
        self.accelerator = accelerator
        self.total_limit = total_limit

    @staticmethod
    def complete_in(output_dir) -> list[tuple[int, Path]]:
        found = []
        output_dir = Path(output_dir)
        if output_dir.is_dir():
            for path in output_dir.iterdir():
                match = STEP_DIR.match(path.name)
                if match and (path / STATE_FILE).is_file():
                    found.append((int(match.group(1)), path))
        return sorted(found)

    def complete(self) -> list[tuple[int, Path]]:
        return self.complete_in(self.output_dir)

    @staticmethod
    def problem(path: Path) -> str | None:
        """Why `path` cannot be resumed from, or None when it is a complete checkpoint."""
        if not path.exists():
            return "no such folder"
        if not path.is_dir():
            return "not a folder"
        if not (path / STATE_FILE).is_file():
            return (f"not a complete checkpoint (no {STATE_FILE}; a save that was interrupted leaves such a folder, "
                    "and step_N folders written by this script end with it)")
        return None

    def resolve(self, value: str) -> Path | None:
        if value == "latest":
            found = self.complete()
            if not found:
                logger.info("--resume_from_checkpoint latest: no checkpoint in %s, starting from scratch", self.output_dir)
            return found[-1][1] if found else None
        path = Path(value)
        problem = self.problem(path)
        if problem:
            raise FileNotFoundError(f"{path}: {problem}")
        return path

    def remove_partial(self):
        if self.accelerator.is_main_process and self.output_dir.is_dir():
            for path in self.output_dir.glob(".tmp-step_*"):
                shutil.rmtree(path, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def save(self, step: int, state: dict) -> Path:
        from accelerate.utils import broadcast_object_list

        final = self.output_dir / f"step_{step}"
        tmp = self.output_dir / f".tmp-step_{step}"
        # Every process must make the same collective calls (save_state, wait_for_everyone). Whether the checkpoint
        # already exists (a run resumed from an older step) is therefore decided once, by the main process: a
        # slower process that looked for itself could see the folder the main process had just renamed into
        # place, skip the calls, and leave the others waiting forever.
        exists = (final / STATE_FILE).is_file() if self.accelerator.is_main_process else None
        if broadcast_object_list([exists])[0]:
            return final
        self.accelerator.save_state(str(tmp))
        # save_state has every process write its own files (its random states) and returns without waiting for
        # the others: the folder is renamed only once all of them have written, or a slower process would write
        # into a folder that is gone (seen with one process delayed).
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
            if final.exists():  # an incomplete leftover of the same name
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._rotate()
        self.accelerator.wait_for_everyone()
        return final

    def _rotate(self):
        if self.total_limit:
            for _, path in self.complete()[: -self.total_limit]:
                shutil.rmtree(path, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------------
# Metrics


@torch.no_grad()
def example_counts(outputs, batch) -> torch.Tensor:
    """Per example: [MLM loss sum, MLM correct, MLM count, pair loss, pair correct, pair count], shape (batch, 6);
    "pair" is the 2-way head's task (SOP or NSP; its logits are `sop_logits` either way).

    Per-example rows let `gather_for_metrics` drop the samples accelerate repeats to even out the last batch.
    No grad: the training loop sums these into a running window, which would otherwise chain every step's
    logits into one autograd graph that is never freed (about 30 MB a step at H=256, batch 32).
    """
    sop_logits = outputs.sop_logits
    counts = torch.zeros(sop_logits.shape[0], 6, dtype=torch.float64, device=sop_logits.device)
    labels = batch.get("labels")
    if labels is not None and outputs.mlm_loss is not None:
        masked = labels != -100
        owner = masked.nonzero()[:, 0]  # the example of each predicted token, in the head's row order
        targets = labels[masked]
        logits = outputs.prediction_logits.float()
        token_loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none").double()
        counts[:, 0].index_add_(0, owner, token_loss)
        counts[:, 1].index_add_(0, owner, (logits.argmax(-1) == targets).double())
        counts[:, 2] = masked.sum(1)
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[:, 3] = torch.nn.functional.cross_entropy(sop_logits.float(), order, reduction="none").double()
        counts[:, 4] = (sop_logits.argmax(-1) == order).double()
        counts[:, 5] = 1
    return counts


def metrics_from_counts(totals: torch.Tensor, prefix: str = "", pair_task: str = "sop") -> dict:
    """Mean losses and accuracies; the 2-way head's metrics are named after the task it is trained on (sop/nsp)."""
    mlm_loss, mlm_correct, mlm_n, pair_loss, pair_correct, pair_n = totals.tolist()
    metrics = {}
    if mlm_n:
        metrics.update({f"{prefix}mlm_loss": mlm_loss / mlm_n, f"{prefix}mlm_accuracy": mlm_correct / mlm_n})
    if pair_n:
        metrics.update({f"{prefix}{pair_task}_loss": pair_loss / pair_n,
                        f"{prefix}{pair_task}_accuracy": pair_correct / pair_n})
    return metrics


@torch.no_grad()
def evaluate(model, dataloader, accelerator, task: str) -> dict:
    model.eval()
    totals = torch.zeros(6, dtype=torch.float64)
    for batch in dataloader:
        if task == "none":
            batch.pop("sentence_order_label", None)
        with accelerator.autocast():
            outputs = model(**batch)
        totals += accelerator.gather_for_metrics(example_counts(outputs, batch)).sum(0).cpu()
    model.train()
    return metrics_from_counts(totals, prefix="eval_", pair_task=task)


# ----------------------------------------------------------------------------------------------------------------
# Data, tokenizer, model


def load_documents(args):
    """The corpus as documents ("text" column): files, a Hub dataset, or the embedded default corpus."""
    from .corpus import load_corpus

    if args.dataset_name:
        return load_corpus(args.dataset_name, text_column=args.text_column, config_name=args.dataset_config_name,
                           streaming=args.streaming)
    if args.train_files:
        return load_corpus(args.train_files, layout=args.layout, text_column=args.text_column,
                           streaming=args.streaming)
    return load_corpus(None)


def split_documents(documents, args):
    """Hold out whole documents for evaluation, so no evaluation sentence was seen in training."""
    import datasets

    if args.validation_split_percentage == 0:
        return documents, None
    if isinstance(documents, datasets.IterableDataset):  # no length: the first documents of the stream
        held_out = max(1, int(args.validation_split_percentage * 20))
        return documents.skip(held_out), documents.take(held_out)
    if len(documents) < 2:
        raise ValueError(f"The corpus has {len(documents)} document(s); evaluation needs at least 2 "
                         "(or pass --validation_split_percentage 0)")
    split = documents.train_test_split(test_size=args.validation_split_percentage / 100, seed=args.seed)
    return split["train"], split["test"]


def load_tokenizer(args, train_documents):
    from transformers import AutoTokenizer

    from .hub import loading
    from .tokenization import train_tokenizer

    if args.tokenizer_name:
        with loading("--tokenizer_name", args.tokenizer_name):
            return AutoTokenizer.from_pretrained(args.tokenizer_name, trust_remote_code=args.trust_remote_code)
    if args.model_name_or_path and Path(args.model_name_or_path, "tokenizer.json").is_file():
        with loading("--model_name_or_path", args.model_name_or_path):
            return AutoTokenizer.from_pretrained(args.model_name_or_path)
    return train_tokenizer(train_documents, vocab_size=args.vocab_size, text_column="text",
                           sentence_per_line=args.layout == "sentence_per_line")


def build_pairs(documents, tokenizer, args, dupe_factor, seed, one_chunk="random_next"):
    from .pretraining_data import build_pretraining_dataset

    return build_pretraining_dataset(
        documents, tokenizer, text_column="text", sentence_per_line=args.layout == "sentence_per_line",
        num_proc=args.preprocessing_num_workers, max_seq_length=args.max_seq_length,
        short_seq_prob=args.short_seq_prob, dupe_factor=dupe_factor, task="nsp" if args.task == "nsp" else "sop",
        seed=seed, one_chunk=one_chunk,
    )


def build_model(args, tokenizer):
    from . import AlbertHFConfig, AlbertHFForPreTraining
    from .hub import loading

    if args.model_name_or_path:
        with loading("--model_name_or_path", args.model_name_or_path):
            model = AlbertHFForPreTraining.from_pretrained(args.model_name_or_path)
    else:
        if args.config_name:
            with loading("--config_name", args.config_name):
                config = AlbertHFConfig.from_pretrained(args.config_name)
        else:
            config = AlbertHFConfig.from_preset(args.model_config)
        config.vocab_size = len(tokenizer)
        if args.sharing:
            config = AlbertHFConfig(**{**config.to_diff_dict(), "sharing": args.sharing})
        if args.max_seq_length > config.max_position_embeddings:
            raise ValueError(f"--max_seq_length {args.max_seq_length} exceeds the model's "
                             f"max_position_embeddings={config.max_position_embeddings}")
        model = AlbertHFForPreTraining(config)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")
    for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
        setattr(model.config, name.replace("cls", "bos").replace("sep", "eos"), getattr(tokenizer, name))
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    return model


def make_optimizer(model, args):
    from .optimization import AdamWeightDecay, Lamb, parameter_groups

    groups = parameter_groups(model, weight_decay=args.weight_decay)
    optimizer_class = Lamb if args.optimizer == "lamb" else AdamWeightDecay
    return optimizer_class(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                           eps=args.adam_epsilon)


# ----------------------------------------------------------------------------------------------------------------
# Fill-mask examples for the end-of-run summary (the helpers: albert_hf/analysis/fill_mask.py)


def held_out_fill_mask(model, tokenizer, eval_documents, args, count=4, documents_read=50) -> list[dict]:
    """`fill_mask_examples` on sentences of the first held-out documents (a seeded sample already, or the
    first documents of a stream); [] when there is nothing to show."""
    if eval_documents is None:  # --validation_split_percentage 0: no held-out sentence to show
        return []
    from .analysis.fill_mask import fill_mask_examples, pick_fill_mask_sentences

    if tokenizer.mask_token is None:
        logger.info("No fill-mask examples: the tokenizer has no mask token")
        return []
    texts = [row["text"] for row in islice(eval_documents, documents_read)]  # reads a stream's head only
    sentences = pick_fill_mask_sentences(texts, tokenizer, count=count, seed=args.seed,
                                         max_length=args.max_seq_length,
                                         sentence_per_line=args.layout == "sentence_per_line")
    if not sentences:
        logger.info("No fill-mask examples: the first %d held-out documents have no sentence of 8 to 30 words with "
                    "a one-piece content word", documents_read)
    return fill_mask_examples(model, tokenizer, sentences)


# ----------------------------------------------------------------------------------------------------------------
# The job


def training_step(model, batch, optimizer, scheduler, accelerator, max_grad_norm):
    """One micro-batch: forward, backward, and on the last micro-batch of an accumulation clipping and the update.

    Under fp16 the grad scaler skips an update whose gradients overflowed (the weights are left untouched);
    the schedule then does not advance either, as in transformers' Trainer.
    """
    with accelerator.accumulate(model):
        with accelerator.autocast():
            outputs = model(**batch)
        accelerator.backward(outputs.loss)
        if accelerator.sync_gradients and max_grad_norm:
            accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)  # global norm, after unscaling
        optimizer.step()
        if accelerator.sync_gradients and not accelerator.optimizer_step_was_skipped:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    return outputs


def enable_cpu_fp16(accelerator):
    """accelerate silently trains in fp32 when asked for fp16 on a CPU; torch has CPU fp16 autocast and loss
    scaling, so turn them on (slow: CPUs have no fp16 matmul units; use bf16 for speed, fp16 for parity with GPU
    runs). This sets two attributes of the Accelerator before `prepare`; tests/test_pretraining.py checks it."""
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")


def main(argv=None):
    args = parse_args(argv)
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm
    from transformers import AutoModel

    from .data_collator import DataCollatorForAlbertPretraining
    from .distributed import describe, gather_full_model, make_accelerator, shard_for_fsdp2
    from .hub import first_line, push_folder
    from .optimization import get_official_schedule

    accelerator = make_accelerator(
        mixed_precision=args.mixed_precision,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        log_with=args.report_to if args.with_tracking else None,
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=f"{args.output_dir}/runs"),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if accelerator.is_main_process else logging.WARNING)
    quiet_library_logs()
    if accelerator.mixed_precision == "fp16" and accelerator.scaler is None:
        enable_cpu_fp16(accelerator)
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    if args.overwrite_output_dir and accelerator.is_main_process:
        cleared = clear_previous_run(output_dir)
        if cleared:
            logger.info("--overwrite_output_dir: deleted the earlier run's %s", ", ".join(cleared))
    accelerator.wait_for_everyone()
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = StepCheckpoints(output_dir, accelerator, args.checkpoints_total_limit)
    checkpoints.remove_partial()

    with accelerator.main_process_first():  # the main process builds the caches, the others read them
        documents = load_documents(args)
        train_documents, eval_documents = split_documents(documents, args)
        tokenizer = load_tokenizer(args, train_documents)
        train_pairs = build_pairs(train_documents, tokenizer, args, args.dupe_factor, args.seed)
        eval_pairs = None
        if eval_documents is not None:
            # Held-out pairs without the one-sentence-chunk quirk (a random-document B labelled 1 even for SOP):
            # the SOP accuracy then measures order prediction only, and chance is 50%.
            eval_pairs = build_pairs(eval_documents, tokenizer, args, 1, args.seed + 1, one_chunk="skip")
            if hasattr(eval_pairs, "__len__") and args.max_eval_samples:
                eval_pairs = eval_pairs.select(range(min(args.max_eval_samples, len(eval_pairs))))
            elif args.max_eval_samples:
                eval_pairs = eval_pairs.take(args.max_eval_samples)

    # Dynamic masks keyed on (seed, epoch, example) (`set_epoch` below): the same example gets the same mask
    # whatever the batching, the number of processes or a resume, so runs are exactly reproducible.
    collate = DataCollatorForAlbertPretraining(
        tokenizer=tokenizer, mlm_probability=args.mlm_probability, max_ngram=args.max_ngram,
        max_predictions_per_seq=args.max_predictions_per_seq, seed=args.seed,
    )
    train_dataloader = DataLoader(train_pairs, batch_size=args.per_device_train_batch_size, collate_fn=collate,
                                  shuffle=hasattr(train_pairs, "__len__"))
    eval_dataloader = None
    if eval_pairs is not None:
        # Static masking: every evaluation sees the same masks, so the numbers are comparable over time.
        eval_collate = DataCollatorForAlbertPretraining(
            tokenizer=tokenizer, mlm_probability=args.mlm_probability, max_ngram=args.max_ngram,
            max_predictions_per_seq=args.max_predictions_per_seq, seed=args.seed, static_masking=True,
        )
        eval_dataloader = DataLoader(eval_pairs, batch_size=args.per_device_eval_batch_size, collate_fn=eval_collate)

    model = build_model(args, tokenizer)
    if args.torch_compile:
        model.compile_blocks()
    if accelerator.is_fsdp2:  # before the optimizer is built: it must hold the sharded parameters
        shard_for_fsdp2(model, accelerator.state.fsdp_plugin)
    optimizer = make_optimizer(model, args)
    # The schedule counts optimizer steps; it is stepped by hand (not prepared), once per update, so that it
    # follows the official formula whatever the number of processes.
    scheduler = get_official_schedule(optimizer, args.num_warmup_steps, args.max_train_steps)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    if eval_dataloader is not None:
        eval_dataloader = accelerator.prepare(eval_dataloader)
    accelerator.register_for_checkpointing(scheduler)

    num_parameters = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
    global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes
    if args.with_tracking:
        if not accelerator.log_with:
            raise SystemExit(f"error: --with_tracking: no usable tracker for --report_to {args.report_to} (for "
                             "tensorboard: pip install tensorboard, or albert_hf[tracking])")
        accelerator.init_trackers("albert_pretraining", {k: v for k, v in vars(args).items()
                                                         if isinstance(v, (int, float, str, bool))})
    logger.info("%s parameters; global batch %d x %d tokens; %d steps; %s; mixed precision %s",
                f"{num_parameters:,}", global_batch, args.max_seq_length, args.max_train_steps,
                describe(accelerator, model), accelerator.mixed_precision)

    metrics_log = output_dir / "metrics.jsonl"
    # The training metrics logged every --logging_steps are means over a window of steps. The window's sums
    # travel with the checkpoint (summed over processes, held by the main process), so that a resumed run logs
    # exactly what the uninterrupted run would have, wherever the checkpoint fell inside a window.
    window = torch.zeros(6, dtype=torch.float64)
    window_tokens, window_seconds = 0, 0.0
    completed_steps, epoch, batches_in_epoch, skipped_steps = 0, 0, 0, 0
    if args.resume_from_checkpoint:
        path = checkpoints.resolve(args.resume_from_checkpoint)
        if path is not None:
            try:
                accelerator.load_state(str(path))
                state = json.loads((path / STATE_FILE).read_text())
                completed_steps, epoch, batches_in_epoch = state["step"], state["epoch"], state["batches_in_epoch"]
            except (OSError, RuntimeError, ValueError, KeyError) as error:
                raise SystemExit(f"error: --resume_from_checkpoint {path}: cannot load it: {first_line(error)}")
            skipped_steps = state.get("skipped_steps", 0)
            if accelerator.is_main_process and "window" in state:
                window = torch.tensor(state["window"], dtype=torch.float64)
                window_tokens, window_seconds = state["window_tokens"], state["window_seconds"]
            if accelerator.is_main_process:
                truncate_metrics_log(metrics_log, completed_steps)
            logger.info("Resumed from %s: step %d, epoch %d, batch %d of the epoch", path, completed_steps,
                        epoch, batches_in_epoch)

    def log(metrics: dict):
        if args.with_tracking:
            accelerator.log(metrics, step=completed_steps)
        if accelerator.is_main_process:
            with open(metrics_log, "a") as f:
                f.write(json.dumps({"step": completed_steps, **metrics}) + "\n")

    progress = tqdm(total=args.max_train_steps, initial=completed_steps, disable=not accelerator.is_main_process,
                    desc="pretraining", dynamic_ncols=True)
    window_start = time.perf_counter() - window_seconds
    eval_metrics = {}
    model.train()
    while completed_steps < args.max_train_steps:
        collate.set_epoch(epoch)
        if hasattr(train_dataloader, "set_epoch"):
            train_dataloader.set_epoch(epoch)
        batches = train_dataloader
        if batches_in_epoch:
            batches = accelerator.skip_first_batches(train_dataloader, batches_in_epoch)
        for batch in batches:
            batches_in_epoch += 1
            if args.task == "none":
                batch.pop("sentence_order_label", None)
            outputs = training_step(model, batch, optimizer, scheduler, accelerator, args.max_grad_norm)
            window += example_counts(outputs, batch).sum(0).cpu()
            window_tokens += int(batch["attention_mask"].sum()) * accelerator.num_processes
            if not accelerator.sync_gradients:
                continue
            completed_steps += 1
            skipped_steps += accelerator.optimizer_step_was_skipped
            progress.update(1)

            if completed_steps % args.logging_steps == 0 or completed_steps == args.max_train_steps:
                elapsed = time.perf_counter() - window_start
                train_metrics = metrics_from_counts(accelerator.reduce(window.to(accelerator.device), "sum").cpu(),
                                                    pair_task=args.task)
                train_metrics.update(lr=scheduler.get_last_lr()[0], tokens_per_second=window_tokens / elapsed)
                if skipped_steps:
                    train_metrics["skipped_steps"] = skipped_steps  # fp16 overflows (no update, no LR step)
                progress.set_postfix({k.replace("_accuracy", "_acc"): f"{v:.3g}" for k, v in train_metrics.items()
                                      if k != "lr"})
                log({f"train_{k}" if k not in ("lr", "tokens_per_second", "skipped_steps") else k: v
                     for k, v in train_metrics.items()})
                window.zero_()
                window_tokens, window_start = 0, time.perf_counter()

            if eval_dataloader is not None and args.eval_steps and completed_steps % args.eval_steps == 0:
                eval_metrics = evaluate(model, eval_dataloader, accelerator, args.task)
                log(eval_metrics)
                logger.info("step %d: %s", completed_steps, _format(eval_metrics))

            if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
                window_sum = accelerator.reduce(window.to(accelerator.device), "sum").cpu()
                checkpoints.save(completed_steps, {
                    "step": completed_steps, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
                    "skipped_steps": skipped_steps, "window": window_sum.tolist(), "window_tokens": window_tokens,
                    "window_seconds": time.perf_counter() - window_start,
                })
            if completed_steps >= args.max_train_steps:
                break
        else:
            epoch += 1
            batches_in_epoch = 0
    progress.close()

    if eval_dataloader is not None and (not args.eval_steps or args.max_train_steps % args.eval_steps):
        eval_metrics = evaluate(model, eval_dataloader, accelerator, args.task)
        log(eval_metrics)
    accelerator.wait_for_everyone()

    final = gather_full_model(accelerator, model)
    if accelerator.is_main_process:
        save_final_model(final, tokenizer, output_dir, args, eval_metrics, global_batch, accelerator.num_processes)
        reloaded = AutoModel.from_pretrained(output_dir, trust_remote_code=True)
        summary = {"output_dir": str(output_dir), "parameters": num_parameters, "steps": completed_steps,
                   "global_batch": global_batch, "reloaded_with": f"AutoModel -> {type(reloaded).__name__}",
                   **eval_metrics}
        # after the save: the examples are a look at the saved model, not part of it (nor of all_results.json)
        from .analysis.fill_mask import format_fill_mask

        examples = held_out_fill_mask(final, tokenizer, eval_documents, args)
        if examples:
            (output_dir / FILL_MASK_FILE).write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n")
        print("\n".join(["", "Pretraining done."] + [f"  {k}: {_format_value(v)}" for k, v in summary.items()]
                        + format_fill_mask(examples)))
        if args.push_to_hub:
            repo_id = args.hub_model_id or output_dir.name
            print(f"  pushed: {push_folder(output_dir, repo_id, token=args.hub_token, commit_message='End of training')}")
    accelerator.wait_for_everyone()
    # Last: it finishes the trackers and destroys the process group (a barrier after it would fail). A process
    # that exits with the group alive can abort in teardown ("terminate called without an active exception").
    accelerator.end_training()
    return eval_metrics


def save_final_model(model, tokenizer, output_dir: Path, args, eval_metrics, global_batch, num_processes):
    """Weights, tokenizer, remote code, model card: written into a temporary folder, then moved into place."""
    from .hub import write_json, write_pretraining_card

    tmp = output_dir / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_json(tmp / "all_results.json", eval_metrics)
    write_pretraining_card(tmp, model, args, global_batch, num_processes)  # its metrics: all_results.json
    for path in tmp.iterdir():
        os.replace(path, output_dir / path.name)
    tmp.rmdir()


class _DropTiedWeightsNotice(logging.Filter):
    # accelerate's save_state warns that it dropped the tied decoder weights; they are re-tied on load.
    def filter(self, record):
        return "Removed shared tensor" not in record.getMessage()


def quiet_library_logs():
    """Keep the console to our progress and results: accelerate's per-file checkpoint notices go to WARNING."""
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").addFilter(_DropTiedWeightsNotice())
    import datasets
    import transformers

    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()


def _format_value(value):
    return f"{value:.4f}" if isinstance(value, float) else value


def _format(metrics: dict) -> str:
    return ", ".join(f"{k}={_format_value(v)}" for k, v in metrics.items())


if __name__ == "__main__":
    main()
