"""run_pretraining.py's arguments: five typed groups on the command line (HfArgumentParser, so that
`run_pretraining.py args.yaml` works too), resolved and checked once (`resolution.parse_args`) into a frozen
`PretrainingArguments`.

The job (`job.py`, its loop in `loop.py`) hands each part of the run the group it needs, or explicit values: the
inputs get `DataArgs` (the corpus, the tokenizer, the pairs), the model builder `ModelArgs` and the config resolved
here, the optimizer `OptimizationArgs`, the checkpoints and the final folder what `OutputArgs` says of them.
"""

import dataclasses
from dataclasses import dataclass, field

from transformers import HfArgumentParser

from ..configuration_albert_hf import PRESETS, SHARING_MODES, AlbertHFConfig
from ..hub.upload import HUB_STRATEGIES
from ..optimization import OPTIMIZERS, SCHEDULES
from ..runtime.hardware import MIXED_PRECISION_CHOICES
from ..runtime.secrets import without_secrets
from .data.corpus import LAYOUTS
from .data.pairs import TASKS as PAIR_TASKS
from .data.sources import Sources
from .schedule import SchedulePlan
from .training.step import LOSS_NORMALIZATIONS
from .training.step_graph import MODE as STEP_GRAPH

# torch.compile modes (--torch_compile_mode), and ours: the blocks compiled, the whole step one CUDA graph
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune", STEP_GRAPH)
AUTO, EAGER = "auto", "none"  # the default (the fastest step the run can have: `step_graph.default_mode`), and eager


@dataclass(frozen=True)
class ModelArgs:
    _argument_group_name = "model"  # a heading of --help

    model_config: str = field(
        default="tiny",
        metadata={"help": "preset with the official v2 dimensions (tiny is a demo size)", "choices": sorted(PRESETS)},
    )
    config_name: str | None = field(
        default=None, metadata={"help": "a config.json path or directory (overrides --model_config)"}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "continue pretraining from these weights (albert_hf or transformers ALBERT)"}
    )
    sharing: str | None = field(
        default=None,
        metadata={
            "help": "override the config's cross-layer sharing (the paper's Table 4 ablation)",
            "choices": list(SHARING_MODES),
        },
    )
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations in backward"})
    torch_compile: bool = field(
        default=False,
        metadata={
            "help": "torch.compile each distinct transformer block and the MLM head with its loss (`compile_blocks`): "
            "one graph for all shared layer applications, compiled in seconds; padding removal and the last-block "
            "selection stay on. Dynamic shapes on CPUs, static on GPUs (one batch shape there)"
        },
    )
    torch_compile_mode: str | None = field(
        default=AUTO,
        metadata={
            "help": "torch.compile's mode; as in transformers, giving it turns --torch_compile on. reduce-overhead "
            f"replays CUDA graphs of the compiled blocks on a GPU; {STEP_GRAPH} compiles them in the default "
            "mode and captures the whole training step (forward, backward, clipping, the update) as one CUDA graph: "
            "one "
            f"process on a CUDA device, bf16 or fp32, no activation checkpointing. {AUTO} (unless --torch_compile is "
            f"given): {STEP_GRAPH} where it can run on a CUDA device, else the eager step (the start line says why); "
            f"{EAGER}: the eager step",
            "choices": [AUTO, EAGER, *COMPILE_MODES],
        },
    )


@dataclass(frozen=True)
class DataArgs:
    _argument_group_name = "data and tokenizer"  # a heading of --help

    train_files: list[str] | None = field(
        default=None,
        metadata={
            "help": "text files or folders (.txt), or json/jsonl/parquet/csv files with a text column; default: the "
            "embedded corpus (standard-library docstrings)"
        },
    )
    sources: list[str] | None = field(
        default=None,
        metadata={
            "help": "several corpora mixed, one word a source: name=NAME,weight=W,KEY=VALUE,... where W is the "
            "source's "
            "share of the training pairs (normalised), or size (by each source's size) or size^A (by size to the power "
            "A in [0, 1], as multilingual models sample languages), the same shortcut for all; the KEYs are a single "
            "corpus's: train_files (repeat it for several), dataset_name, dataset_config_name, split, text_column, "
            "layout, or prepared_data (a folder of --preprocess_only). E.g. --sources name=books,weight=0.7,"
            "train_files=books/ name=wiki,weight=0.3,dataset_name=wikitext,dataset_config_name=wikitext-103-raw-v1. "
            "In a recipe: sources: a list of mappings of those keys"
        },
    )
    drop_sources: list[str] | None = field(
        default=None,
        metadata={
            "help": "resuming a mixed run without these sources of its checkpoint (without this flag, a source missing "
            "from --sources is refused)"
        },
    )
    dataset_name: str | None = field(default=None, metadata={"help": "a datasets Hub name, e.g. wikitext"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. wikitext-103-raw-v1"})
    text_column: str = field(
        default="text",
        metadata={"help": "the column holding the text in --dataset_name or json/parquet/csv --train_files"},
    )
    layout: str = field(
        default="document_per_file",
        metadata={
            "help": "how plain-text files hold documents (sentence_per_line = the official format: one sentence per "
            "line, a blank line between documents)",
            "choices": list(LAYOUTS),
        },
    )
    streaming: bool = field(
        default=False,
        metadata={
            "help": "read the corpus as training goes (each process its own files, endlessly) instead of preparing all "
            "pairs first"
        },
    )
    validation_split_percentage: float = field(
        default=5.0, metadata={"help": "percentage of documents held out for evaluation (0: none)"}
    )
    max_eval_samples: int | None = field(default=2000, metadata={"help": "held-out pairs evaluated (0: all)"})
    tokenizer_name: str | None = field(
        default=None,
        metadata={
            "help": "tokenizer directory or Hub name; default: train a SentencePiece unigram model on the training "
            "corpus (cached)"
        },
    )
    vocab_size: int = field(
        default=4000, metadata={"help": "vocabulary size when training the tokenizer (the official models use 30000)"}
    )
    tokenizer_sample_sentences: int = field(
        default=10_000_000,
        metadata={
            "help": "when training the tokenizer: at most this many sentences, sampled uniformly from the whole corpus "
            "(SentencePiece's input_sentence_size; the official recipe: 10,000,000). The sample is held in memory"
        },
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "allow code from --tokenizer_name's repository (a tokenizer class of its own)"}
    )
    extend_vocabulary: int | None = field(
        default=None,
        metadata={
            "help": "a continued run (--model_name_or_path): add the N pieces a SentencePiece model trained on the "
            "domain "
            "uses most and the vocabulary lacks, the embeddings grown to match (data/vocabulary.py)"
        },
    )
    extend_vocabulary_from: str | None = field(
        default=None,
        metadata={
            "help": "with --extend_vocabulary and several --sources: the source (its name) the new pieces are learned "
            "from; one corpus is its own domain"
        },
    )
    max_seq_length: int = field(default=128, metadata={"help": "tokens per pair (official: 512)"})
    short_seq_prob: float = field(
        default=0.1,
        metadata={"help": "probability of a shorter target length for a pair, as the official pair builder (0.1)"},
    )
    dupe_factor: int = field(
        default=5,
        metadata={"help": "how many times the corpus is cut into pairs, each time differently (official: 40)"},
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "processes for tokenizing and building pairs (datasets' num_proc)"}
    )
    dataloader_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "DataLoader worker processes that mask and batch the pairs while the model runs (not with "
            '--streaming); default: 2 with a CUDA device, 0 on CPUs (measured in BENCHMARKS.md, "DataLoader workers on '
            'a CPU")'
        },
    )
    preprocess_only: bool = field(
        default=False,
        metadata={
            "help": "write the tokenizer and the pairs into --output_dir and stop, for runs with --prepared_data (the "
            "official create_pretraining_data.py step)"
        },
    )
    prepared_data: str | None = field(
        default=None,
        metadata={
            "help": "train on a folder written by --preprocess_only: no corpus reading or tokenizing; the arguments "
            "that shaped its pairs come from its manifest"
        },
    )


@dataclass(frozen=True)
class ObjectiveArgs:
    _argument_group_name = "objective"  # a heading of --help

    task: str = field(
        default="sop",
        metadata={
            "help": "inter-sentence objective beside MLM: sentence order (ALBERT), next sentence (BERT) or none",
            "choices": [*PAIR_TASKS, "none"],
        },
    )
    mlm_probability: float = field(default=0.15, metadata={"help": "share of tokens masked (official: 0.15)"})
    max_ngram: int = field(default=3, metadata={"help": "longest masked n-gram (official: 3; 1 = BERT's masking)"})
    max_predictions_per_seq: int = field(
        default=20, metadata={"help": "most masked tokens per pair (official: 20 at length 512)"}
    )


@dataclass(frozen=True)
class OptimizationArgs:
    _argument_group_name = "optimization"  # a heading of --help

    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "pairs per optimizer step over all processes (the paper: 4096): the accumulation follows from the "
            "processes and --per_device_train_batch_size; the start line says the split"
        },
    )
    per_device_train_batch_size: int = field(default=32, metadata={"help": "pairs per process per micro-batch"})
    gradient_accumulation_steps: int = field(
        default=1, metadata={"help": "micro-batches per optimizer step (with --global_batch_size: worked out from it)"}
    )
    auto_find_batch_size: bool = field(
        default=False,
        metadata={
            "help": "take the largest micro-batch of at most --per_device_train_batch_size that runs a training step "
            "on "
            "the device and divides the global batch's share of a process, trying it (a CPU: only where the memory a "
            "measured step predicts fits); the accumulation then keeps the global batch, which transformers' flag of "
            "this name does not"
        },
    )
    loss_normalization: str = field(
        default="global",
        metadata={
            "help": "global: a step's MLM loss is the mean over every masked token of the global batch (all "
            "micro-batches, all processes); per_device: each process's mean over its own masked tokens, averaged over "
            "the processes (the official code on TPU cores, for parity runs)",
            "choices": list(LOSS_NORMALIZATIONS),
        },
    )
    optimizer: str = field(
        default="lamb",
        metadata={
            "help": "lamb: official TF LAMB; adamw: official AdamWeightDecay (no bias correction)",
            "choices": list(OPTIMIZERS),
        },
    )
    learning_rate: float = field(
        default=1e-2,
        metadata={"help": "peak LR; the default suits the tiny demo model (the paper: 0.00176 for batch 4096)"},
    )
    weight_decay: float = field(
        default=0.01, metadata={"help": "decoupled weight decay (not on LayerNorm and bias parameters)"}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "first-moment decay (official: 0.9)"})
    adam_beta2: float = field(
        default=0.999,
        metadata={
            "help": "second-moment decay (official: 0.999). Neither optimizer corrects the moments' bias, so for the "
            "first ~1/(1-beta2) steps the LayerNorm and bias parameters (no trust ratio) move several times lr per "
            "step; with a warm-up much shorter than that, deeper models can stall for hundreds of steps. Short runs: "
            "0.98, or a longer --num_warmup_steps"
        },
    )
    adam_epsilon: float = field(default=1e-6, metadata={"help": "official: 1e-6"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "global gradient clipping (0: none)"})
    max_consecutive_skips: int = field(
        default=25,
        metadata={
            "help": "a step whose loss or gradients are not finite is skipped on the device (no weight or optimizer "
            "state changes; logged as skipped_steps); this many in a row stop the run with one line naming the newest "
            "finite checkpoint (0: never stop for that)"
        },
    )
    on_divergence: str = field(
        default="stop",
        metadata={
            "help": "when the run diverges (--max_consecutive_skips skipped steps, a held-out loss or the weights not "
            "finite): stop with one line, or roll back to the newest finite checkpoint from before it and go on with "
            "the batches after it (needs --checkpointing_steps)",
            "choices": ["stop", "rollback"],
        },
    )
    max_rollbacks: int = field(
        default=3, metadata={"help": "with --on_divergence rollback: the rollbacks a run may make before it stops"}
    )
    max_train_steps: int = field(default=1500, metadata={"help": "optimizer steps"})
    num_warmup_steps: int | None = field(
        default=None, metadata={"help": "default: 2.5%% of --max_train_steps, the official ratio (3125 of 125k)"}
    )
    lr_scheduler_type: str = field(
        default="official",
        metadata={
            "help": "official: linear warm-up, then linear decay to 0 at --max_train_steps (the paper's); wsd: "
            "warm-up, the peak held, then a 1-sqrt decay over the last --decay_steps, so that a run can be extended "
            "(a larger --max_train_steps on resume) and decays branched off it (--decay_from)",
            "choices": list(SCHEDULES),
        },
    )
    decay_steps: int | None = field(
        default=None,
        metadata={
            "help": "wsd: the decay's length in steps (default: 20%% of --max_train_steps, or the resumed checkpoint's)"
        },
    )
    decay_from: str | None = field(
        default=None,
        metadata={
            "help": "a step_N checkpoint of a wsd run's stable phase: train a decay branch from it, --decay_steps "
            "steps into a new --output_dir (no --max_train_steps); the branch may take other --sources"
        },
    )
    mixed_precision: str = field(
        default="auto",
        metadata={
            "help": "auto: bf16 autocast where the hardware has bf16 units (CPUs with AMX or AVX-512 BF16, CUDA GPUs "
            "from Ampere on), fp16 with loss scaling on older GPUs, fp32 elsewhere; the start line says which and why. "
            "An accelerate config's bf16 or fp16 is taken as asked; no: fp32",
            "choices": list(MIXED_PRECISION_CHOICES),
        },
    )
    tf32: bool | None = field(
        default=None,
        metadata={"help": "fp32 matmuls on TF32 tensor cores (CUDA GPUs from Ampere on); default: on where they exist"},
    )
    seed: int = field(default=12345, metadata={"help": "seeds the split, the pairs, the masks and the weights"})


@dataclass(frozen=True)
class OutputArgs:
    _argument_group_name = "evaluation, checkpoints and output"  # a heading of --help

    output_dir: str = field(
        default="outputs/albert-pretraining",
        metadata={"help": "where the model, tokenizer, card, metrics.jsonl and step_N checkpoints go"},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "start over in an --output_dir that holds an earlier run: its checkpoints, logs, results and model "
            "are deleted first (without this flag, such a folder is refused)"
        },
    )
    take_over_lock: bool = field(
        default=False,
        metadata={
            "help": "take --output_dir's lock even if a run on another host holds it (which cannot be checked from "
            "here); a lock of this host's ended run is taken over without it"
        },
    )
    eval_steps: int = field(default=500, metadata={"help": "evaluate every N optimizer steps (0: only at the end)"})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "pairs per process per evaluation batch"})
    logging_steps: int = field(default=20, metadata={"help": "log training means every N optimizer steps"})
    peak_tflops: float | None = field(
        default=None,
        metadata={
            "help": "the TFLOP/s of one device that the logged mfu divides by (default: a known GPU's dense spec peak "
            "for the precision in use; a CPU has none)"
        },
    )
    no_plots: bool = field(
        default=False,
        metadata={"help": "do not draw training_curves.png (the curves of metrics.jsonl, with the held-out baselines)"},
    )
    checkpointing_steps: int | None = field(
        default=None, metadata={"help": "save the full training state into step_N every N steps"}
    )
    checkpoints_total_limit: int | None = field(default=None, metadata={"help": "keep only the newest N step_N"})
    average_last: int | None = field(
        default=None,
        metadata={
            "help": "at the end, also write OUTPUT_DIR/average_last_K: the mean of the weights of the last K step_N "
            "checkpoints (python -m albert_hf.average)"
        },
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "'latest' (the newest complete step_N in --output_dir, or a fresh start when there is none), a "
            "step_N folder, or 'hub' / 'hub:REPO[@REVISION]' (the training state --hub_strategy checkpoint pushed to "
            "--hub_model_id or REPO, downloaded into --output_dir: a run continues on another machine)"
        },
    )
    with_tracking: bool = field(default=False, metadata={"help": "log to the trackers of --report_to"})
    report_to: str = field(
        default="tensorboard", metadata={"help": "accelerate tracker(s): tensorboard, wandb, all, ..."}
    )
    dry_run: bool = field(
        default=False,
        metadata={
            "help": "print the plan of this run on the hardware in hand (parameters, the peak memory of a training "
            "step "
            "with and without activation checkpointing, whether it fits, tokens/s, the time to --max_train_steps) from "
            "a few real steps on synthetic batches, write nothing, and exit"
        },
    )
    push_to_hub: bool = field(default=False, metadata={"help": "upload the final folder to the Hub"})
    hub_strategy: str = field(
        default="end",
        metadata={
            "help": "with --push_to_hub, what goes up while the run trains (transformers' names): end, only the final "
            "folder; every_save, the model as of each checkpoint too, uploaded in the background; checkpoint, also the "
            "full training state of the newest checkpoint in last-checkpoint/; all_checkpoints, as every_save, each "
            "checkpoint's model also kept as a branch step-N",
            "choices": list(HUB_STRATEGIES),
        },
    )
    hub_model_id: str | None = field(default=None, metadata={"help": "repo id (default: the output_dir name)"})
    hub_token: str | None = field(default=None, metadata={"help": "default: the saved Hub login"})
    license: str | None = field(
        default=None, metadata={"help": "the license named in the model card, a Hub license id (e.g. apache-2.0)"}
    )


ARGUMENT_GROUPS = (ModelArgs, DataArgs, ObjectiveArgs, OptimizationArgs, OutputArgs)
MAPPING_LISTS = ("sources",)  # an arguments file may give these as lists of mappings (a recipe's `sources:`)


def build_parser() -> HfArgumentParser:
    return HfArgumentParser(
        ARGUMENT_GROUPS,
        description=(
            "Pretrain ALBERT (MLM + sentence-order prediction) with accelerate. With no arguments: a tiny ALBERT on "
            "the "
            "embedded corpus (standard-library docstrings) for a few minutes. A single .json or .yaml file of "
            "arguments may replace the flags."
        ),
    )


@dataclass(frozen=True)
class PretrainingArguments:
    """The run's arguments once resolved and checked (`resolution.parse_args`), read-only from then on: every part of
    the run reads the values the checks saw."""

    model: ModelArgs
    data: DataArgs
    objective: ObjectiveArgs
    optimization: OptimizationArgs
    output: OutputArgs
    # The model's config, resolved once from --model_name_or_path, --config_name or --model_config (and --sharing);
    # a model built from scratch takes its vocabulary from the tokenizer (`model.build_model`).
    config: AlbertHFConfig
    # With --prepared_data: the shaping arguments taken from its manifest that differ from this command's.
    adopted: tuple[str, ...] = ()
    # The launch's processes (its WORLD_SIZE), read once with the flags: the global batch is split for them.
    processes: int = 1
    # --sources (or a --prepared_data folder of several), checked: a mixed run's sources and their weights' rule.
    sources: Sources | None = None
    # The learning-rate schedule: the arguments', or the one of the checkpoint a resume or a decay branch continues.
    schedule: SchedulePlan | None = None

    def flat(self) -> dict:
        """Every argument by its flag's name, secrets masked (for trackers' run configs and the prepared data's
        manifest)."""
        return without_secrets(flat_values((self.model, self.data, self.objective, self.optimization, self.output)))


def flat_values(groups) -> dict:
    """The groups' arguments by their flags' names."""
    return {name: value for group in groups for name, value in dataclasses.asdict(group).items()}


def with_values(groups: tuple, values: dict) -> tuple:
    """The groups with `values` (flag name -> value) in place of their own, each in the group that has it."""
    return tuple(
        dataclasses.replace(
            group,
            **{name: value for name, value in values.items() if name in {f.name for f in dataclasses.fields(group)}},
        )
        for group in groups
    )
