"""What run_glue.py, run_squad.py, run_race.py and run_ner.py share: arguments, loading, the train/evaluate flow,
outputs.

Each script defines only its task's data arguments, preprocessing, metrics and predictions, and calls:

    model_args, data_args, training_args = parse_arguments(DataArguments, argv)
    last_checkpoint = setup(training_args)
    tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForSequenceClassification, num_labels=3)
    trainer = AlbertTrainer(model=model, args=training_args, processing_class=tokenizer, ...)
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, num_train_examples)  # train_results.json
    if training_args.do_eval:
        metrics = evaluate_splits(trainer, {"validation": eval_dataset})  # flat eval_* keys, via save_results
    finish(trainer, model_args, training_args, data_args)  # model card from all_results.json; --push_to_hub

Any albert_hf checkpoint works, and any transformers ALBERT checkpoint (model_type "albert", e.g.
`albert/albert-base-v2` or a local copy) is converted on load: the weight names are the same.
"""

import json
import logging
import shutil
import sys
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    HfArgumentParser,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from .. import AlbertHFConfig
from ..errors import InputError
from ..hub.loading import check_tokenizer, loading
from ..hub.model_card import CardDataset, write_finetuned_card
from ..optimization import AdamWeightDecay, get_official_schedule, parameter_groups
from ..reports.curves import CURVES_FILE, trainer_curves
from ..runtime import output_lock
from ..runtime.cli import explicit_arguments, is_first_process, parse_into_dataclasses, run_entry_point
from ..runtime.distributed import (
    cpu_processes_without_gpus,
    describe,
    end_distributed,
    gather_full_model,
    requested_mode,
    shard_model,
    use_fsdp,
)
from ..runtime.hardware import PRECISION_NAMES, bf16_trainer_warning, detect
from ..runtime.preemption import PREEMPTED, StopOnSignal
from ..runtime.secrets import SecretsNotPickled
from ..runtime.storage import StorageError, agreed, check_writable, fault_line, folder_bytes, refused

logger = logging.getLogger("albert_hf.tasks.finetuning")

# Every official fine-tuning script (run_classifier.py, run_squad_v1/v2.py, run_race.py) builds the optimizer of
# optimization.py: AdamWeightDecay without bias correction, eps 1e-6, decoupled weight decay 0.01, linear warm-up
# then linear decay counted from step 0, global-norm clipping at 1.0.
OFFICIAL_FINETUNING = dict(official_optimizer=True, adam_epsilon=1e-6, weight_decay=0.01, max_grad_norm=1.0)
PAPER_HPARAMS_FILE = "paper_hparams.json"


# The flags of an evaluation schedule: one given explicitly replaces the recipe's schedule as a whole (a recipe's
# --save_steps beside the user's --save_strategy no would contradict --load_best_model_at_end).
EVALUATION_SCHEDULE = {"eval_strategy", "eval_steps", "save_strategy", "save_steps", "load_best_model_at_end"}


def best_on_dev(steps: int) -> dict:
    """A recipe's evaluation schedule: every `steps` steps a checkpoint is scored on dev, and the best is kept
    (`recipe_arguments` applies it to runs with --do_train and --do_eval; the others have no dev set)."""
    return dict(best_checkpoint_every=steps)


# (seed, output folder) of the one seed a --seeds run is running now (tasks/seeds.py); None outside such a run.
# AlbertTrainingArguments takes them in place of the command line's --seed and --output_dir, however often the
# script parses its arguments (--paper_hparams parses them again).
THIS_SEED: ContextVar[tuple[int, str] | None] = ContextVar("albert_hf_this_seed", default=None)


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
        default=None, metadata={"help": "dropout on the attention probabilities for fine-tuning; default: config's "
                                        "(--paper_hparams sets it with --hidden_dropout_prob to the one ALBERT DR)"}
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
        default=False, metadata={"help": "take output_dir's lock even if a run on another host holds it (which "
                                 "cannot be checked from here); a lock of this host's ended run is taken over "
                                 "without it"}
    )
    official_optimizer: bool = field(
        default=False,
        metadata={"help": "the official fine-tuning optimizer: AdamWeightDecay (Adam without bias correction, "
                  "decoupled weight decay, LayerNorm/bias excluded) and linear warmup then linear decay counted "
                  "from step 0, instead of Trainer's AdamW and schedule"},
    )
    compile_blocks: bool = field(
        default=False,
        metadata={"help": "torch.compile each transformer block (the model's compile_blocks) instead of the whole "
                  "model as --torch_compile does: compiled in seconds, and padding removal and the last-block "
                  "selection stay on"},
    )
    paper_hparams: bool = field(
        default=False,
        metadata={"help": "ALBERT's fine-tuning recipe for the task (docs/official_recipe.md): learning rate, total "
                  "batch, steps, warm-up, maximum lengths, dropout and the official optimizer; SQuAD v2.0 also the "
                  "answerability head and the dev-tuned null threshold. Flags given explicitly are kept; the values "
                  f"used are written to OUTPUT_DIR/{PAPER_HPARAMS_FILE} and the model card"},
    )
    no_plots: bool = field(
        default=False,
        metadata={"help": "do not draw OUTPUT_DIR/training_curves.png (training loss, evaluation metrics and learning "
                  "rate from the log history; the model card shows it)"},
    )
    seeds: list[int] | None = field(
        default=None,
        metadata={"help": "fine-tune once per seed, one after another, each in OUTPUT_DIR/seed_N; then the median, "
                  "mean +- standard error, minimum and maximum of every dev metric over the seeds that learned go to "
                  "OUTPUT_DIR/all_seeds_results.json, and the best seed's model (by --metric_for_best_model, else "
                  "the task's main metric) to OUTPUT_DIR. Needs --do_train and --do_eval"},
    )
    num_seeds: int | None = field(
        default=None, metadata={"help": "as --seeds, with the N seeds --seed, --seed + 1, ..."})
    retry_failed_seeds: int = field(
        default=0,
        metadata={"help": "with --seeds / --num_seeds: replace a seed that did not learn (its dev score at or below "
                  "the task's trivial baseline: the majority class, MCC 0, correlation 0.1, the empty answer, "
                  "chance) by a new seed, up to this many times"},
    )

    def __post_init__(self):
        self.check_seeds()
        seed_run = THIS_SEED.get()
        if seed_run is not None:  # one seed of a --seeds run: its seed and folder; it pushes nothing itself
            self.seed, self.output_dir = seed_run
            self.seeds = self.num_seeds = None
            self.retry_failed_seeds = 0
            self.push_to_hub = False
        # Whether the user chose these; if not, --load_best_model_at_end uses the task's main metric
        # (`best_by_task_metric`), where Trainer would take the loss.
        self.metric_for_best_model_given = self.metric_for_best_model is not None
        self.greater_is_better_given = self.greater_is_better is not None
        if (self.bf16 or self.bf16_full_eval) and not self.use_cpu and not torch.cuda.is_available() \
                and not transformers.utils.is_torch_bf16_gpu_available():
            # transformers refuses --bf16 without a bf16 GPU unless --use_cpu is given (a traceback); on a machine
            # without CUDA the CPU is where the run trains anyway (the start line names it, and warns if slow)
            self.use_cpu = True
        super().__post_init__()
        if self.compile_blocks and self.torch_compile:
            raise InputError("--compile_blocks and --torch_compile both compile the model: pass one of them")

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
            raise InputError("--seeds / --num_seeds fine-tune once per seed and compare them on the dev set: pass "
                             "--do_train and --do_eval")
        if self.resume_from_checkpoint:
            raise InputError("--resume_from_checkpoint names one run's checkpoint; a --seeds run resumes each seed "
                             "folder's last checkpoint by itself: run the same command again")


class AlbertTrainer(Trainer):
    """Trainer that, with --official_optimizer, builds the official optimizer and schedule (`optimization.py`).

    Otherwise it is transformers' Trainer unchanged. Task trainers (e.g. for SQuAD post-processing) subclass it.
    With --compile_blocks the model's blocks are compiled in place before training.

    Under `accelerate launch` it runs in the mode the config asks for, as run_pretraining.py does
    (`runtime/distributed.py`): DDP over gloo on CPUs, and FSDP2 with ALBERT's own units on GPUs and CPUs alike (Trainer
    alone would shard with the config's auto-wrap policy on GPUs and silently skip FSDP on CPUs). Under FSDP the
    saved model is always the full one, whatever the config's state-dict type.
    """

    def __init__(self, *args, **kwargs):
        self.fsdp_plugin, self.fsdp_request = requested_mode()  # before Trainer builds its Accelerator
        super().__init__(*args, **kwargs)
        if self.is_fsdp_enabled and self.fsdp_request.activation_checkpointing:
            self.model.activation_checkpointing_enable()
        if getattr(self.args, "compile_blocks", False):
            self.model.compile_blocks()
        if self.is_fsdp_enabled:  # before the optimizer is built: it must hold the sharded parameters
            self.model = self.model_wrapped = shard_model(
                self.accelerator, self.model, send_first_process_weights=self.fsdp_request.ram_efficient_loading)

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint; one that a full disk or a refused folder stops is removed (Trainer writes in place),
        every process stops with one line naming the checkpoint that is complete."""
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        fault = agreed(self.accelerator, refused(lambda: super(AlbertTrainer, self)._save_checkpoint(model, trial)))
        if fault is None:
            return
        written = folder_bytes(folder)
        if self.is_world_process_zero():
            shutil.rmtree(folder, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        complete = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        intact = (f"{Path(complete).name} is complete: free space (or fix the folder), then run the same command "
                  "again: it resumes from there") if complete else \
            "no checkpoint is complete yet: free space (or fix the folder), then run again"
        needed = max(written, folder_bytes(Path(complete)) if complete else 0)
        raise StorageError(fault_line(fault, f"the step-{self.state.global_step} checkpoint", run_dir, needed, intact))

    def _build_accelerator_args(self, **kwargs):
        accelerator_args = super()._build_accelerator_args(**kwargs)
        if self.fsdp_plugin is not None:
            accelerator_args["fsdp_plugin"] = self.fsdp_plugin
        return accelerator_args

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        if self.fsdp_plugin is not None:
            use_fsdp(self.accelerator, self.fsdp_plugin)
            self.is_fsdp_enabled = True

    def describe_mode(self) -> str:
        """Where this run trains, for the start line, e.g. 'FSDP2 over 2 processes on 1 machine (gloo, cpu): this
        process holds 50.0% of the parameters', with what an FSDP config asked for that was done differently."""
        notes = list(self.fsdp_request.notes) if self.is_fsdp_enabled else []
        if self.is_fsdp_enabled and self.fsdp_request.ram_efficient_loading:
            notes.append("fsdp_cpu_ram_efficient_loading: the first process's weights were sent to the others")
        precision = PRECISION_NAMES["bf16" if self.args.bf16 else "fp16" if self.args.fp16 else "no"]
        return f"{describe(self.accelerator, self.model, detect())}; {precision}" + "".join(f"; {n}" for n in notes)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        if not self.is_fsdp_enabled:
            return super().save_model(output_dir, _internal_call)
        # Trainer writes no model at all under a SHARDED_STATE_DICT config, and saving the sharded module itself
        # would copy torch's FSDP sources as the folder's remote code. The full weights are gathered into a plain
        # model instead (a collective: every process calls save_model) and written as Trainer writes a model.
        plain = gather_full_model(self.accelerator, self.model)
        if plain is not None and self.args.should_save:
            output_dir = Path(output_dir or self.args.output_dir)
            plain.save_pretrained(output_dir)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            torch.save(self.args, output_dir / TRAINING_ARGS_NAME)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        # --hub_strategy every_save / checkpoint / all_checkpoints: Trainer copies the checkpoint's weights, config and
        # tokenizer into output_dir and pushes that folder; the model code the config's auto_map names stayed behind,
        # and the pushed revision could not be loaded until the final push brought it
        if self.is_world_process_zero():
            for path in Path(checkpoint_folder).glob("*.py"):
                shutil.copy(path, Path(self.args.output_dir) / path.name)
        super()._push_from_checkpoint(checkpoint_folder)

    def get_eval_dataloader(self, eval_dataset=None):
        # Trainer caches the evaluation loader under one key for every dataset passed in, and with
        # --dataloader_persistent_workers hands the cached loader out again: a second dev set (MNLI mismatched)
        # would be scored on the first. Another set gets a loader of its own, as for prediction (same batch size,
        # sequential order).
        if eval_dataset is not None and not isinstance(eval_dataset, str) and eval_dataset is not self.eval_dataset:
            return self.get_test_dataloader(eval_dataset)
        return super().get_eval_dataloader(eval_dataset)

    def create_optimizer(self, model=None):
        if not getattr(self.args, "official_optimizer", False) or self.optimizer is not None:
            return super().create_optimizer(model)
        groups = parameter_groups(self.model if model is None else model, weight_decay=self.args.weight_decay)
        self.optimizer = AdamWeightDecay(groups, lr=self.args.learning_rate,
                                         betas=(self.args.adam_beta1, self.args.adam_beta2), eps=self.args.adam_epsilon)
        return self.optimizer

    def create_scheduler(self, num_training_steps, optimizer=None):
        if not getattr(self.args, "official_optimizer", False) or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        warmup_steps = self.args.get_warmup_steps(num_training_steps)
        if warmup_steps > num_training_steps:
            logger.warning("warmup_steps %d > training steps %d: warming up over all %d steps", warmup_steps,
                           num_training_steps, num_training_steps)
            warmup_steps = num_training_steps
        self.lr_scheduler = get_official_schedule(optimizer or self.optimizer, warmup_steps, num_training_steps)
        self._created_lr_scheduler = True
        return self.lr_scheduler


def parse_arguments(data_arguments_class, argv=None) -> tuple:
    """A fine-tuning script's arguments, checked: the launcher's mode first, then each dataclass's `__post_init__`.

    Args:
        data_arguments_class: the script's data arguments (e.g. `glue.GlueDataArguments`).
        argv: the arguments (default: the command line), or one .json/.yaml file holding them.

    Returns:
        (ModelArguments, data arguments, AlbertTrainingArguments).

    Raises:
        InputError: a value the checks refuse; argparse's own usage error (exit status 2) for an unknown flag.
    """
    requested_mode()  # a launcher mode that cannot be had stops here, before TrainingArguments try it
    cpu_processes_without_gpus()  # before TrainingArguments decide the device
    return parse_into_dataclasses(HfArgumentParser((ModelArguments, data_arguments_class, AlbertTrainingArguments)),
                                  argv)


# The split each of TrainingArguments' --do_* flags asks for.
SPLIT_FLAGS = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}


def best_by_task_metric(training_args, metric: str):
    """--load_best_model_at_end without --metric_for_best_model keeps the checkpoint best on the task's main metric
    (`metric`, e.g. "accuracy"; higher is better), as the official code does, where Trainer would take the loss.

    Returns:
        `training_args` itself, or a copy checked again with the metric set.
    """
    if not training_args.load_best_model_at_end or training_args.metric_for_best_model_given:
        return training_args
    logger.info("--load_best_model_at_end keeps the checkpoint with the best dev %s (the task's main metric; "
                "--metric_for_best_model chooses another)", metric)
    return replace(training_args, metric_for_best_model=metric, greater_is_better=True
                   if not training_args.greater_is_better_given else training_args.greater_is_better)


def wanted_splits(training_args) -> list[str]:
    """The splits the run's --do_train / --do_eval / --do_predict ask for, in that order."""
    return [split for split, flag in SPLIT_FLAGS.items() if getattr(training_args, flag[2:])]


def wanted_samples(training_args, data_args) -> dict[str, int | None]:
    """The splits the run asks for and how many rows of each it reads: the one place the scripts learn it.

    Args:
        training_args: --do_train, --do_eval, --do_predict.
        data_args: the script's data arguments, with --max_train_samples, --max_eval_samples, --max_predict_samples.

    Returns:
        {split: max_samples (None: every row)} for "train", "validation", "test" as asked for, in that order. None
        asked for stops the run with one line (InputError).
    """
    caps = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
            "test": data_args.max_predict_samples}
    wanted = {split: caps[split] for split in wanted_splits(training_args)}
    if not wanted:
        raise InputError("nothing to do; pass --do_train, --do_eval and/or --do_predict")
    return wanted


def start_logging(training_args: TrainingArguments) -> None:
    """The scripts' log format, INFO from the main process, transformers' own warnings and above."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if training_args.should_log else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()


def claim_output_dir(training_args: TrainingArguments) -> Path:
    """--output_dir checked writable and locked for this run (one run per folder, `runtime/output_lock.py`; released
    when the script ends). Returns it as a Path."""
    output_dir = Path(training_args.output_dir)
    check_writable(output_dir, "--output_dir")
    if is_first_process():
        output_lock.acquire(output_dir, "--output_dir", getattr(training_args, "take_over_lock", False))
    return output_dir


def refuse_a_trained_model(output_dir: Path) -> None:
    """An output folder holding a model that no checkpoint or record of ours explains is another run's: never
    silently overwritten."""
    if any(p.suffix in (".safetensors", ".bin") for p in output_dir.iterdir()):
        raise InputError(f"{output_dir} already holds a trained model; pass --overwrite_output_dir to replace it, "
                         "or another --output_dir")


def setup(training_args: TrainingArguments) -> str | None:
    """Logging, seed, and the checkpoint to resume from.

    An output_dir that already holds a run is never silently overwritten: its last checkpoint is resumed, or
    the run stops unless --overwrite_output_dir is given.

    Args:
        training_args: the run's arguments (`output_dir`, `seed`, `do_train`, `resume_from_checkpoint`, `bf16`).

    Returns:
        The checkpoint folder to resume from, or None to start fresh.

    Raises:
        InputError: --output_dir cannot be written, or holds a trained model and no checkpoint.
    """
    start_logging(training_args)
    slow = bf16_trainer_warning(detect()) if training_args.bf16 and training_args.should_log else None
    if slow:  # first, before the data is read: the user can stop a slow run at once
        logger.warning(slow)
    set_seed(training_args.seed)
    output_dir = claim_output_dir(training_args)  # before the data is read
    last_checkpoint = None
    if training_args.do_train and output_dir.is_dir() and not getattr(training_args, "overwrite_output_dir", False):
        last_checkpoint = get_last_checkpoint(str(output_dir))
        if training_args.resume_from_checkpoint:
            last_checkpoint = training_args.resume_from_checkpoint
        elif last_checkpoint is None:
            refuse_a_trained_model(output_dir)
        if last_checkpoint is not None:
            logger.info("Resuming from %s (pass --overwrite_output_dir to start over)", last_checkpoint)
    return last_checkpoint


def load_checkpoint_config(model_args: ModelArguments):
    """The checkpoint's own config as saved (AutoConfig: its labels, problem type), before anything overrides it:
    what the scripts compare the data's labels with."""
    flag, config_name = model_args.source("config")
    with loading(flag, config_name):
        return AutoConfig.from_pretrained(config_name, trust_remote_code=model_args.trust_remote_code,
                                          cache_dir=model_args.cache_dir, revision=model_args.model_revision,
                                          token=model_args.token)


def load_tokenizer_and_model(model_args: ModelArguments, model_class, **config_overrides):
    """The tokenizer and the model a fine-tuning run starts from.

    Args:
        model_args: the checkpoint (--model_name_or_path, or --config_name / --tokenizer_name), its Hub revision,
            token and cache folder, and the dropout overrides.
        model_class: the head to load, an AlbertHFFor* class; a transformers ALBERT checkpoint is converted on load.
        **config_overrides: config fields set on load (the labels: num_labels, id2label, label2id, ...).

    Returns:
        (tokenizer, model); the tokenizer always returns token_type_ids. A checkpoint that cannot be read, or a
        tokenizer larger than the model's vocabulary, stops with one line naming the argument (InputError).
    """
    hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token)
    flag, tokenizer_name = model_args.source("tokenizer")
    with loading(flag, tokenizer_name):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=model_args.trust_remote_code, **hub)
    check_tokenizer(tokenizer, flag, tokenizer_name)
    if "token_type_ids" not in tokenizer.model_input_names:
        # transformers' AlbertTokenizer leaves them out by default; ALBERT's segment embeddings need them.
        tokenizer.model_input_names = [*tokenizer.model_input_names, "token_type_ids"]
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob"):
        if getattr(model_args, name) is not None:
            config_overrides[name] = getattr(model_args, name)
    flag, config_name = model_args.source("config")
    with loading(flag, config_name):
        config = AlbertHFConfig.from_pretrained(config_name, **config_overrides, **hub)
    with loading("--model_name_or_path", model_args.model_name_or_path):
        model = model_class.from_pretrained(
            model_args.model_name_or_path, config=config,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **hub,
        )
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"The tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
                         f"{model.config.vocab_size}: they do not belong together")
    return tokenizer, model


def check_columns(dataset, required, where: str, expected: str = "") -> None:
    """Stop with the file/split and the missing column named, before any preprocessing runs; `expected` says
    what the rows should look like (e.g. " for mrpc (expected [...])")."""
    missing = [name for name in required if name not in dataset.column_names]
    if missing:
        raise InputError(f"{where}: missing column(s) {missing}{expected}; found {dataset.column_names}")


def fit_max_seq_length(data_args, config):
    """The data arguments with `max_seq_length` capped at the model's positions, with a warning, as transformers'
    examples do: a script's default (GLUE 128, SQuAD 384, RACE 512) then works with a model that has fewer.

    Args:
        data_args: a script's data arguments (a dataclass with `max_seq_length`); left as they are.
        config: the model's config.

    Returns:
        `data_args` itself when the length fits, else a copy with the capped length, checked again by its
        `__post_init__`.
    """
    if data_args.max_seq_length <= config.max_position_embeddings:
        return data_args
    logger.warning("--max_seq_length %d is longer than the model's %d positions; using %d",
                   data_args.max_seq_length, config.max_position_embeddings, config.max_position_embeddings)
    return replace(data_args, max_seq_length=config.max_position_embeddings)


def padding_collator(collator_class, tokenizer, pad_to_max_length: bool, half_precision: bool):
    """`default_data_collator` when --pad_to_max_length padded the inputs already, else `collator_class` padding each
    batch to its longest row (to a multiple of 8 in fp16/bf16)."""
    if pad_to_max_length:
        return default_data_collator
    return collator_class(tokenizer, pad_to_multiple_of=8 if half_precision else None)


def limit(dataset, max_samples: int | None):
    return dataset if max_samples is None else dataset.select(range(min(max_samples, len(dataset))))


class StopOnSignalCallback(TrainerCallback):
    """SIGTERM, SIGINT or SIGUSR1 (in any process) ends training after the current optimizer step, with a
    checkpoint-N that Trainer's --resume_from_checkpoint continues from (`runtime/preemption.py`)."""

    def __init__(self, stop: StopOnSignal):
        self.stop = stop
        self.stopped_at: int | None = None  # the step after which it stopped training (the same in every process)

    def on_step_end(self, args: TrainingArguments, state, control, **kwargs):
        if self.stop.agreed(args.device):  # every process asks at every step: they agree on the same step
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step


def train(trainer, training_args, last_checkpoint: str | None, num_examples: int | None) -> dict:
    """Train (resuming if asked), save the final model with its tokenizer, write train_results.json.

    A fresh all_results.json is started: results of an earlier run in output_dir describe another model. A stop
    signal during training saves a checkpoint and exits with status PREEMPTED (75): see StopOnSignalCallback.

    Args:
        trainer: the script's Trainer, its training dataset set.
        training_args: the run's arguments (`output_dir`).
        last_checkpoint: the checkpoint to resume from (`setup`), or None.
        num_examples: the training examples before windowing, reported as `train_samples`.

    Returns:
        The training metrics as written to train_results.json.
    """
    if trainer.is_world_process_zero():
        Path(training_args.output_dir, "all_results.json").unlink(missing_ok=True)
    # From here on a signal waits for the end of a step (Trainer builds its loaders and workers in train: a signal
    # there must not cut their start short), and the first step's checkpoint is written; after training, the
    # script's StopOnSignal records one too (`saving`), and the run completes.
    with StopOnSignal() as stop:
        stop.saving()
        logger.info("Fine-tuning: %s", trainer.describe_mode())
        callback = StopOnSignalCallback(stop)
        trainer.add_callback(callback)
        result = trainer.train(resume_from_checkpoint=last_checkpoint)
        trainer.remove_callback(callback)
        # A signal after the last step (or only after training) stops nothing: the run finishes as usual.
        if callback.stopped_at is not None and callback.stopped_at < trainer.state.max_steps:
            checkpoint = Path(training_args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
            if trainer.is_world_process_zero():
                # A --seeds run resumes each seed's folder by itself and refuses --resume_from_checkpoint.
                alone = "" if THIS_SEED.get() else ", or pass --resume_from_checkpoint with that folder"
                print(f"Stopped by {stop.name} after step {trainer.state.global_step} of {trainer.state.max_steps}: "
                      f"the training state is in {checkpoint}. To continue, run the same command (it resumes from "
                      f"the last checkpoint in --output_dir){alone}", file=sys.stderr, flush=True)
            raise SystemExit(PREEMPTED)
    # An internal save: with --push_to_hub, Trainer would otherwise upload here with its own model card; `finish`
    # pushes once, with ours.
    trainer.save_model(_internal_call=True)
    metrics = {**result.metrics, "train_samples": num_examples}
    save_results(trainer, "train", metrics)
    trainer.save_state()
    return metrics


def train_evaluate_predict(trainer, training_args, last_checkpoint: str | None, num_train_examples: int | None,
                           evaluate: Callable[[], dict], predict: Callable[[dict | None], dict | None],
                           baseline: Callable[[], object] | None = None) -> dict:
    """The stages every fine-tuning script runs after building its Trainer, in order and as its flags ask:
    --do_train, --do_eval (the dev set), --do_predict (the test set).

    Args:
        trainer: the script's Trainer, its training and evaluation datasets set.
        training_args: the run's `TrainingArguments` (`do_train`, `do_eval`, `do_predict`).
        last_checkpoint: the checkpoint training resumes from (`setup`), or None.
        num_train_examples: the training examples before windowing (questions, sentences), for the start line.
        evaluate: evaluates the dev set, writes eval_results.json and returns its metrics.
        predict: given the dev set's metrics (None without --do_eval; SQuAD 2.0 takes its tuned no-answer
            threshold from them), predicts the test set, writes the task's predictions file and, when the test set
            has labels, predict_results.json; returns those metrics, or None.
        baseline: the dev score of a model that learned nothing (`seeds.Baseline`), which a --seeds run compares
            each seed's with.

    Returns:
        {"validation": metrics, "test": metrics, "baseline": Baseline}, for the stages that ran and gave metrics:
        what `main` returns.
    """
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, num_train_examples)
    results = {}
    if training_args.do_eval:
        results["validation"] = evaluate()
        if baseline is not None:
            results["baseline"] = baseline()
    if training_args.do_predict:
        metrics = predict(results.get("validation"))
        if metrics is not None:
            results["test"] = metrics
    return results


def save_results(trainer, kind: str, metrics: dict) -> dict:
    """Log `metrics` and write them as transformers' example scripts do: `<kind>_results.json` and merged into
    `all_results.json`, which thus holds every result of the run.

    Args:
        trainer: the run's Trainer (its `output_dir`; only the main process writes).
        kind: "train", "eval" or "predict".
        metrics: one flat dict, its keys prefixed `<kind>_` by whoever computed them.

    Returns:
        `metrics`, unchanged.
    """
    trainer.log_metrics(kind, metrics)
    if trainer.is_world_process_zero():
        Path(trainer.args.output_dir).mkdir(parents=True, exist_ok=True)
    trainer.save_metrics(kind, metrics, combined=True)
    return metrics


def suffixed(metrics: dict, suffix: str) -> dict:
    """`{key + suffix: value}`: the keys of a second evaluation set (transformers' run_glue: `eval_accuracy_mm`)."""
    return {f"{key}{suffix}": value for key, value in metrics.items()}


def evaluate_splits(trainer, splits: dict, evaluate=None, prefix: str = "eval", suffixes: dict | None = None) -> dict:
    """Evaluate each named split and write `<prefix>_results.json` (and all_results.json) via `save_results`.

    The results are ONE flat dict, as transformers' examples write them: keys `<prefix>_<metric>` plus
    `<prefix>_samples`, so several splits merge into one file.

    Args:
        trainer: the run's Trainer.
        splits: split name -> its tokenized dataset.
        evaluate: `evaluate(trainer, name, dataset, prefix) -> metrics` (keys already prefixed), for tasks that need
            more than `trainer.evaluate` (RACE's chosen letters); default `trainer.evaluate`.
        prefix: "eval" (the dev set) or "predict" (a labelled test set).
        suffixes: split name -> a suffix for its keys (GLUE MNLI's mismatched dev set: "_mm").

    Returns:
        The merged metrics, as written.

    Raises:
        ValueError: two splits would write the same key (a split left without a suffix).
    """
    results = {}
    for name, dataset in splits.items():
        if evaluate is None:
            metrics = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
        else:
            metrics = evaluate(trainer, name, dataset, prefix)
        metrics[f"{prefix}_samples"] = len(dataset)
        metrics = suffixed(metrics, (suffixes or {}).get(name, ""))
        clash = sorted(set(metrics) & set(results))
        if clash:
            raise ValueError(f"split {name!r} would overwrite {clash[:3]} of another split: give it a suffix")
        results.update(metrics)
    return save_results(trainer, prefix, results)


def finish(trainer, model_args: ModelArguments, training_args, data_args, paper_recipe: "PaperRecipe | None" = None,
           card_dataset: CardDataset | None = None) -> None:
    """Write the model card (README.md: `model_card.write_finetuned_card`, metrics from all_results.json) and push
    the output folder when --push_to_hub is set. Nothing contacts the Hub unless pushing.

    Args:
        paper_recipe: what --paper_hparams resolved to, for the card's Recipe section; None without it.
        card_dataset: the card's Data section when the data arguments alone cannot say it (run_glue.py on your own
            data, whose task is read from the data); default `data_args.card_dataset(splits)`.
    """
    def write_card(**_trainer_card_arguments):
        write_finetuned_card(trainer, model_args, training_args, data_args, wanted_splits(training_args),
                             paper_recipe=paper_recipe, dataset=card_dataset)

    if training_args.do_train and not training_args.no_plots and trainer.is_world_process_zero():
        trainer_curves(trainer.state.log_history, Path(training_args.output_dir) / CURVES_FILE)
    if training_args.push_to_hub:
        # Trainer.push_to_hub writes README.md with create_model_card just before uploading: ours instead.
        trainer.create_model_card = write_card
        trainer.push_to_hub()
    elif trainer.is_world_process_zero():
        write_card()


def run_script(main) -> None:
    """A script's entry point: `main()`, then, in every process of a launched run, the process group freed while
    the interpreter is still whole (`distributed.end_distributed`): a gloo group left to the interpreter's exit can
    abort the process after its outputs are written. An InputError (its `error:` line, status 2) or a SystemExit
    (PREEMPTED after a stop signal) ends the process only after that, since its traceback holds main's Trainer and
    with it the group.

    Stop signals (runtime/preemption.py): before the first optimizer step they end the run at once with one line;
    during training (`train`) at the end of a step with a checkpoint; after training they are noted and the run
    completes."""
    run_entry_point(main, finish=end_distributed, stage="reading the data and loading the model")


# ----------------------------------------------------------------------------------------------------------------
# --paper_hparams


@dataclass
class PaperRecipe:
    """What --paper_hparams resolved to, for paper_hparams.json and the model card."""

    name: str  # the recipe's row, e.g. "mrpc", "SQuAD v2.0", "RACE, v2 models"
    values: dict  # argument name -> the value the run uses (the recipe's, or the user's explicit one)
    explicit: list  # the names whose value the user gave explicitly


def recipe_arguments(recipe: dict, explicit: set[str], batch_divisor: int, hidden_dropout_prob: float,
                     with_dev_set: bool = False) -> dict:
    """A task's recipe as the arguments it sets, in the recipe's order.

    `recipe` holds argument values by name, and two values of the recipe tables:
    - `batch_size`, the total batch: per_device_train_batch_size = batch / (gradient_accumulation_steps x
      processes);
    - `albert_dropout`, the paper's "ALBERT DR": the released configurations give the hidden and the attention
      dropout one value, so it sets both hidden_dropout_prob and attention_probs_dropout_prob. An explicit
      --hidden_dropout_prob replaces it for both, unless --attention_probs_dropout_prob is given too.
    An explicit --num_train_epochs keeps the epoch count instead of the recipe's max_steps. A run that trains and
    evaluates (`with_dev_set`) gets the recipe's evaluation schedule, `best_checkpoint_every` (`best_on_dev`):
    a checkpoint scored on dev every that many steps, the best one loaded at the end (by the task's main metric,
    `best_by_task_metric`) and two kept on disk; unless one of `EVALUATION_SCHEDULE` is explicit, which makes the
    schedule the user's, as given.

    Args:
        recipe: the row, e.g. `glue.paper_recipe(task)[1]`.
        explicit: the arguments the user gave (`cli.explicit_arguments`).
        batch_divisor: gradient_accumulation_steps x processes, which the total batch is divided by.
        hidden_dropout_prob: the run's --hidden_dropout_prob, which an explicit one gives the attention too.
        with_dev_set: whether the run trains and evaluates (--do_train and --do_eval).

    Returns:
        argument name -> the recipe's value, explicit arguments included (the caller keeps the user's).
    """
    recipe = dict(recipe)
    batch_size = recipe.pop("batch_size", None)
    if batch_size is not None:
        if "per_device_train_batch_size" not in explicit and batch_size % batch_divisor:
            raise InputError(f"--paper_hparams: the total batch {batch_size} is not divisible by "
                             f"gradient_accumulation_steps x processes = {batch_divisor}; give "
                             "--per_device_train_batch_size")
        recipe["per_device_train_batch_size"] = batch_size // batch_divisor
    if "albert_dropout" in recipe:
        dropout = recipe.pop("albert_dropout")
        recipe["hidden_dropout_prob"] = dropout
        recipe["attention_probs_dropout_prob"] = hidden_dropout_prob if "hidden_dropout_prob" in explicit else dropout
    if "num_train_epochs" in explicit:
        recipe.pop("max_steps", None)
    every = recipe.pop("best_checkpoint_every", None)
    if every is not None and with_dev_set and not explicit & EVALUATION_SCHEDULE:
        recipe.update(eval_strategy="steps", eval_steps=every, save_strategy="steps", save_steps=every,
                      load_best_model_at_end=True, save_total_limit=2)
    return recipe


def apply_paper_hparams(name: str, recipe: dict, model_args, data_args, training_args, argv=None) -> tuple:
    """--paper_hparams in a script: the arguments parsed again from `argv` with the recipe's values as their
    defaults, so that explicit flags win and every argument check runs once on the values the run uses; those
    values are logged and written to OUTPUT_DIR/paper_hparams.json (TrainingArguments' names).

    Args:
        name: the recipe's row, e.g. "mrpc", "SQuAD v2.0", "RACE, v2 models".
        recipe: its values (`recipe_arguments`).
        model_args, data_args, training_args: the arguments `parse_arguments` gave; left as they are.
        argv: the script's arguments (default: the command line), or one .json/.yaml file.

    Returns:
        (model_args, data_args, training_args, PaperRecipe): the arguments the run uses, and what the recipe
        resolved to, for the model card.
    """
    types = (type(model_args), type(data_args), type(training_args))
    explicit = explicit_arguments(argv, types)
    arguments = recipe_arguments(recipe, explicit, training_args.gradient_accumulation_steps * training_args.world_size,
                                 model_args.hidden_dropout_prob, training_args.do_train and training_args.do_eval)
    applied = {argument: value for argument, value in arguments.items() if argument not in explicit}
    parsed = parse_into_dataclasses(HfArgumentParser(types), argv, defaults=applied)
    names = list(arguments)
    if "per_device_train_batch_size" in arguments:  # the per-device batch is the total batch only with these
        names.append("gradient_accumulation_steps")
    if "num_train_epochs" in explicit:
        names.append("num_train_epochs")
    values = {argument: next(getattr(args, argument) for args in parsed if hasattr(args, argument))
              for argument in names}
    resolved = PaperRecipe(name, values, sorted(explicit & set(values)))
    logger.info("--paper_hparams (%s) set: %s; kept your explicit %s", name,
                ", ".join(f"{k}={v}" for k, v in applied.items()), resolved.explicit or "nothing")
    model_args, data_args, training_args = parsed
    if training_args.should_save:
        path = Path(training_args.output_dir) / PAPER_HPARAMS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(resolved.values, indent=2) + "\n", encoding="utf-8")
        logger.info("The recipe used is in %s", path)
    return model_args, data_args, training_args, resolved
