"""The arguments every fine-tuning script shares: the model to start from (`ModelArguments`), transformers'
TrainingArguments with our options (`AlbertTrainingArguments`), and the seed of one run of a --seeds run
(`SeedRun`)."""

from dataclasses import dataclass, field, replace

import torch
import transformers
from transformers import TrainingArguments

from ..errors import InputError
from ..runtime.hardware import check_peak_tflops
from ..runtime.secrets import SecretsNotPickled
from .paper_hparams import PAPER_HPARAMS_FILE


@dataclass(frozen=True)
class SeedRun:
    """One seed of a --seeds run (tasks/seeds.py), in place of the command line's --seed and --output_dir."""

    seed: int
    output_dir: str


@dataclass
class ModelArguments:
    """The model and tokenizer to fine-tune (argument names as in transformers' example scripts)."""

    model_name_or_path: str = field(
        metadata={"help": "albert_hf or transformers ALBERT checkpoint: a local folder or a Hub name"}
    )
    config_name: str | None = field(default=None, metadata={"help": "config to use instead of the model's"})
    tokenizer_name: str | None = field(default=None, metadata={"help": "tokenizer to use instead of the model's"})
    cache_dir: str | None = field(default=None, metadata={"help": "where Hub downloads are cached"})
    model_revision: str = field(default="main", metadata={"help": "branch, tag or commit of a Hub model"})
    token: str | None = field(default=None, metadata={"help": "Hub token for private models"})
    trust_remote_code: bool = field(default=False, metadata={"help": "allow code from the model repo"})
    license: str | None = field(
        default=None, metadata={"help": "the license named in the model card, a Hub license id (e.g. apache-2.0)"}
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "re-initialise head weights whose shape differs (e.g. another label count)"}
    )
    hidden_dropout_prob: float | None = field(
        default=None, metadata={"help": "ALBERT dropout for fine-tuning (the paper's 'ALBERT DR'); default: config's"}
    )
    attention_probs_dropout_prob: float | None = field(
        default=None,
        metadata={
            "help": "dropout on the attention probabilities for fine-tuning; default: config's "
            "(--paper_hparams sets it with --hidden_dropout_prob to the one ALBERT DR)"
        },
    )
    classifier_dropout_prob: float | None = field(
        default=None, metadata={"help": "dropout before the task head (official: 0.1); default: config's"}
    )

    def source(self, part: str) -> tuple[str, str]:
        """(flag, value) the "config" or "tokenizer" is loaded from: its own argument, else the model's."""
        own = getattr(self, f"{part}_name")
        return (f"--{part}_name", own) if own else ("--model_name_or_path", self.model_name_or_path)


@dataclass
class AlbertTrainingArguments(SecretsNotPickled, TrainingArguments):
    """transformers' TrainingArguments plus options of ours. Pickled (Trainer's `training_args.bin`, in every
    checkpoint and output folder, pushed with them), --hub_token is masked as `to_dict()` masks it."""

    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "start over even if output_dir holds a checkpoint of an earlier run"}
    )
    take_over_lock: bool = field(
        default=False,
        metadata={
            "help": "take output_dir's lock even if a run on another host holds it (which "
            "cannot be checked from here); a lock of this host's ended run is taken over "
            "without it"
        },
    )
    official_optimizer: bool = field(
        default=False,
        metadata={
            "help": "the official fine-tuning optimizer: AdamWeightDecay (Adam without bias correction, "
            "decoupled weight decay, LayerNorm/bias excluded) and linear warmup then linear decay counted "
            "from step 0, instead of Trainer's AdamW and schedule"
        },
    )
    compile_blocks: bool = field(
        default=False,
        metadata={
            "help": "torch.compile each transformer block (the model's compile_blocks) instead of the whole "
            "model as --torch_compile does: compiled in seconds, and padding removal and the last-block "
            "selection stay on"
        },
    )
    paper_hparams: bool = field(
        default=False,
        metadata={
            "help": "ALBERT's fine-tuning recipe for the task (docs/official_recipe.md): learning rate, total "
            "batch, steps, warm-up, maximum lengths, dropout and the official optimizer; SQuAD v2.0 also the "
            "answerability head and the dev-tuned null threshold. Flags given explicitly are kept; the values "
            f"used are written to OUTPUT_DIR/{PAPER_HPARAMS_FILE} and the model card"
        },
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={
            "help": "the TFLOP/s of one device that the logged mfu divides by (default: a known GPU's dense "
            "spec peak for the precision in use; a CPU has none)"
        },
    )
    no_plots: bool = field(
        default=False,
        metadata={
            "help": "do not draw OUTPUT_DIR/training_curves.png (training loss, evaluation metrics and learning "
            "rate from the log history; the model card shows it)"
        },
    )
    seeds: list[int] | None = field(
        default=None,
        metadata={
            "help": "fine-tune once per seed, one after another, each in OUTPUT_DIR/seed_N; then the median, "
            "mean +- standard error, minimum and maximum of every dev metric over the seeds that learned go to "
            "OUTPUT_DIR/all_seeds_results.json, and the best seed's model (by --metric_for_best_model, else "
            "the task's main metric) to OUTPUT_DIR. Needs --do_train and --do_eval"
        },
    )
    num_seeds: int | None = field(
        default=None, metadata={"help": "as --seeds, with the N seeds --seed, --seed + 1, ..."}
    )
    retry_failed_seeds: int = field(
        default=0,
        metadata={
            "help": "with --seeds / --num_seeds: replace a seed that did not learn (its dev score at or below "
            "the task's trivial baseline: the majority class, MCC 0, correlation 0.1, the empty answer, "
            "chance) by a new seed, up to this many times"
        },
    )

    def __post_init__(self):
        self.check_seeds()
        # Whether the user chose these; if not, --load_best_model_at_end uses the task's main metric
        # (`best_by_task_metric`), where Trainer would take the loss.
        self.metric_for_best_model_given = self.metric_for_best_model is not None
        self.greater_is_better_given = self.greater_is_better is not None
        if (
            (self.bf16 or self.bf16_full_eval)
            and not self.use_cpu
            and not torch.cuda.is_available()
            and not transformers.utils.is_torch_bf16_gpu_available()
        ):
            # transformers refuses --bf16 without a bf16 GPU unless --use_cpu is given (a traceback); on a machine
            # without CUDA the CPU is where the run trains anyway (the start line names it, and warns if slow)
            self.use_cpu = True
        super().__post_init__()
        if self.compile_blocks and self.torch_compile:
            raise InputError("--compile_blocks and --torch_compile both compile the model: pass one of them")
        check_peak_tflops(self.peak_tflops)

    def for_seed(self, seed_run: SeedRun) -> "AlbertTrainingArguments":
        """A checked copy for one seed of a --seeds run: its seed and folder, no seeds of its own, and no push (the
        whole run pushes its best seed)."""
        return replace(
            self,
            seed=seed_run.seed,
            output_dir=seed_run.output_dir,
            seeds=None,
            num_seeds=None,
            retry_failed_seeds=0,
            push_to_hub=False,
            # as the user gave them: TrainingArguments fills them in, and the copy must tell them apart
            metric_for_best_model=self.metric_for_best_model if self.metric_for_best_model_given else None,
            greater_is_better=self.greater_is_better if self.greater_is_better_given else None,
        )

    @property
    def seed_list(self) -> list[int] | None:
        """The seeds of a --seeds / --num_seeds run, in order; None for a run of one seed (--seed)."""
        if self.num_seeds is not None:
            return [self.seed + i for i in range(self.num_seeds)]
        return self.seeds

    def check_seeds(self) -> None:
        """A seed list that would run nothing, or one seed twice, is refused before any work."""
        if self.seeds is not None and self.num_seeds is not None:
            raise InputError("--seeds and --num_seeds both choose the seeds: pass one of them")
        if self.seeds is not None:
            if not self.seeds:
                raise InputError("--seeds: no seed given; pass one or more integers, e.g. --seeds 1 2 3")
            twice = sorted({seed for seed in self.seeds if self.seeds.count(seed) > 1})
            if twice:
                raise InputError(f"--seeds: {', '.join(map(str, twice))} given twice; each seed runs once")
        if self.num_seeds is not None and self.num_seeds < 1:
            raise InputError(f"--num_seeds {self.num_seeds}: pass 1 or more")
        if self.retry_failed_seeds < 0:
            raise InputError(f"--retry_failed_seeds {self.retry_failed_seeds}: pass 0 or more")
        if self.seed_list is None:
            if self.retry_failed_seeds:
                raise InputError("--retry_failed_seeds replaces seeds of a --seeds / --num_seeds run: pass one")
            return
        if not (self.do_train and self.do_eval):
            raise InputError(
                "--seeds / --num_seeds fine-tune once per seed and compare them on the dev set: pass "
                "--do_train and --do_eval"
            )
        if self.resume_from_checkpoint:
            raise InputError(
                "--resume_from_checkpoint names one run's checkpoint; a --seeds run resumes each seed "
                "folder's last checkpoint by itself: run the same command again"
            )
