"""The Trainer of the fine-tuning scripts (`AlbertTrainer`: the official optimizer, our distributed modes, checkpoints a
full disk cannot leave half-written and that record what they hold, our model card, model TFLOP/s and MFU in its
log rows), the check of a checkpoint before it is resumed, and the callbacks that count the model's FLOPs, push the
model code with each checkpoint and stop training on a signal.

AlbertTrainer overrides three of Trainer's internals, for want of a public hook (`_save_checkpoint`,
`_build_accelerator_args`, `create_accelerator_and_postprocess`), and works around `get_eval_dataloader`'s cache:
tests/test_finetuning.py fails when transformers changes what they rely on."""

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint, rotate_checkpoints

from ..errors import InputError
from ..flops import HEADS, finetuning_flops_per_token
from ..optimization import AdamWeightDecay, get_official_schedule, parameter_groups
from ..runtime import checkpoint_files
from ..runtime.distributed import describe, gather_full_model, requested_mode, shard_model, use_fsdp
from ..runtime.hardware import PRECISION_NAMES, Precision, detect, mfu_peak
from ..runtime.preemption import StopOnSignal
from ..runtime.storage import StorageError, fault_line, folder_bytes, shared_fault, write_fault
from ..runtime.throughput import flop_rates

logger = logging.getLogger(__name__)


def checkpoint_damage(folder: Path) -> str | None:
    """What keeps checkpoint-N `folder` from being resumed as data ('FILE: what'), or None: a file that differs from
    its record (runtime/checkpoint_files.py), or, in a checkpoint without one, a file Trainer would load that is not
    plain data."""
    if checkpoint_files.record_name(folder) is not None:
        return checkpoint_files.recorded_damage(folder)
    logger.warning("%s: its files are not checked, only read as data", checkpoint_files.unrecorded(folder))
    # what Trainer reads; training_args.bin (the arguments as a pickled object) is never read
    return checkpoint_files.unreadable(
        folder,
        [
            name
            for name in checkpoint_files.files_in(folder)
            if name not in (TRAINING_ARGS_NAME, checkpoint_files.record_part())
        ],
    )


def step_of(path: Path) -> int | None:
    """N of a checkpoint-N folder, or None for another name."""
    number = path.name.rpartition("-")[2]
    return int(number) if path.name.startswith(f"{PREFIX_CHECKPOINT_DIR}-") and number.isdigit() else None


def check_checkpoint(folder) -> None:
    """--resume_from_checkpoint (or the last checkpoint-N in --output_dir): stops with one line naming the file that
    keeps it from being resumed, and the newest earlier checkpoint beside it that can be."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"--resume_from_checkpoint {folder}: no such folder")
    damage = checkpoint_damage(folder)
    if damage is None:
        return
    step = step_of(folder)
    earlier = sorted(
        (step_of(path), path)
        for path in folder.parent.glob(f"{PREFIX_CHECKPOINT_DIR}-*")
        if path.is_dir() and path != folder and step_of(path) is not None and (step is None or step_of(path) < step)
    )
    beside = checkpoint_files.newest_intact([path for _, path in earlier], checkpoint_damage)
    raise InputError(f"--resume_from_checkpoint {folder}: {damage}; {beside}")


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
                self.accelerator, self.model, send_first_process_weights=self.fsdp_request.ram_efficient_loading
            )
        precision = Precision(self.mixed_precision, "as asked", tf32=torch.backends.cuda.matmul.allow_tf32)
        self.mfu_peak, self.mfu_note = mfu_peak(detect(), precision, getattr(self.args, "peak_tflops", None))
        self.model_flops = ModelFlopsCallback(self.model)
        self.add_callback(self.model_flops)
        self.add_callback(ModelCodeCallback())

    def log(self, logs: dict, start_time: float | None = None) -> None:
        """Trainer's log row; a training row (its `loss`) gets the model TFLOP/s of all processes since the last one
        and MFU (`ModelFlopsCallback`). Every process logs at the same steps, so the sum over them is taken here."""
        if "loss" in logs and self.model_flops.head is not None:
            flops, seconds = self.model_flops.take()
            if self.accelerator.num_processes > 1:
                flops = float(self.accelerator.reduce(torch.tensor(flops, device=self.args.device), "sum"))
            logs.update(flop_rates(flops / seconds, self.accelerator.num_processes, self.mfu_peak))
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint; one that a full disk or a refused folder stops is removed (Trainer writes in place),
        every process stops with one line naming the checkpoint that is complete. Private: Trainer has no hook around
        its checkpoint's writes (`on_save` comes after them)."""
        run_dir = Path(self._get_output_dir(trial=trial))
        folder = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotated below, once recorded
        try:
            fault = shared_fault(
                self.accelerator, write_fault(lambda: super(AlbertTrainer, self)._save_checkpoint(model, trial))
            )
        finally:
            self.args.save_total_limit = limit
        if fault is None and self.is_world_process_zero():  # every process has written its files: recorded last
            fault = write_fault(lambda: checkpoint_files.write_record(folder))
        fault = shared_fault(self.accelerator, fault, main_only=True)
        if fault is None:
            if self.args.should_save:  # the checkpoints before it go only now that its record is in place
                rotate_checkpoints(
                    output_dir=str(run_dir),
                    save_total_limit=limit,
                    best_model_checkpoint=self.state.best_model_checkpoint,
                    use_mtime=True,
                )
            return
        written = folder_bytes(folder)
        if self.is_world_process_zero():
            shutil.rmtree(folder, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        complete = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        intact = (
            (
                f"{Path(complete).name} is complete: free space (or fix the folder), then run the same command "
                "again: it resumes from there"
            )
            if complete
            else "no checkpoint is complete yet: free space (or fix the folder), then run again"
        )
        needed = max(written, folder_bytes(Path(complete)) if complete else 0)
        raise StorageError(fault_line(fault, f"the step-{self.state.global_step} checkpoint", run_dir, needed, intact))

    def _build_accelerator_args(self, **kwargs):
        # Trainer builds its FSDP plugin from --fsdp alone; ours, from the launcher's config, reaches its Accelerator
        # through this private method, which has no public counterpart
        accelerator_args = super()._build_accelerator_args(**kwargs)
        if self.fsdp_plugin is not None:
            accelerator_args["fsdp_plugin"] = self.fsdp_plugin
        return accelerator_args

    def create_accelerator_and_postprocess(self):
        # accelerate leaves FSDP off on CPUs whatever the plugin: it is switched on once Trainer has built its
        # Accelerator, and Trainer's own flag (`is_fsdp_enabled`) set, before Trainer reads it
        super().create_accelerator_and_postprocess()
        if self.fsdp_plugin is not None:
            use_fsdp(self.accelerator, self.fsdp_plugin)
            self.is_fsdp_enabled = True

    @property
    def mixed_precision(self) -> str:
        """accelerate's name of the precision --bf16 / --fp16 ask for: "bf16", "fp16" or "no"."""
        return "bf16" if self.args.bf16 else "fp16" if self.args.fp16 else "no"

    def describe_mode(self) -> str:
        """Where this run trains, for the start line, e.g. 'FSDP2 over 2 processes on 1 machine (gloo, cpu): this
        process holds 50.0% of the parameters', with what an FSDP config asked for that was done differently."""
        notes = list(self.fsdp_request.notes) if self.is_fsdp_enabled else []
        if self.is_fsdp_enabled and self.fsdp_request.ram_efficient_loading:
            notes.append("fsdp_cpu_ram_efficient_loading: the first process's weights were sent to the others")
        precision = PRECISION_NAMES[self.mixed_precision]
        notes.append(
            self.mfu_note
            if self.model_flops.head is not None
            else f"no model TFLOP/s or MFU: albert_hf counts no FLOPs for a {type(self.model).__name__}"
        )
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

    def create_model_card(self, *args, card: Callable[[], None] | None = None, **kwargs):
        """Trainer.push_to_hub writes README.md with this just before uploading: `card` (`outputs.finish` passes
        ours, `push_to_hub(card=...)`) writes it instead of Trainer's draft."""
        if card is None:
            return super().create_model_card(*args, **kwargs)
        card()

    def get_eval_dataloader(self, eval_dataset=None):
        # Trainer.get_eval_dataloader caches its loader under the key "eval" for every dataset object passed in
        # (`_eval_dataloaders`) and, with --dataloader_persistent_workers, returns that cached loader for any of them:
        # a second dev set (MNLI mismatched) would be scored on the first. Another set gets a loader of its own, as
        # for prediction (same batch size, sequential order).
        if eval_dataset is not None and not isinstance(eval_dataset, str) and eval_dataset is not self.eval_dataset:
            return self.get_test_dataloader(eval_dataset)
        return super().get_eval_dataloader(eval_dataset)

    def create_optimizer(self, model=None):
        if not getattr(self.args, "official_optimizer", False) or self.optimizer is not None:
            return super().create_optimizer(model)
        groups = parameter_groups(self.model if model is None else model, weight_decay=self.args.weight_decay)
        self.optimizer = AdamWeightDecay(
            groups,
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
        )
        return self.optimizer

    def create_scheduler(self, num_training_steps, optimizer=None):
        if not getattr(self.args, "official_optimizer", False) or self.lr_scheduler is not None:
            return super().create_scheduler(num_training_steps, optimizer)
        warmup_steps = self.args.get_warmup_steps(num_training_steps)
        if warmup_steps > num_training_steps:
            logger.warning(
                "warmup_steps %d > training steps %d: warming up over all %d steps",
                warmup_steps,
                num_training_steps,
                num_training_steps,
            )
            warmup_steps = num_training_steps
        self.lr_scheduler = get_official_schedule(optimizer or self.optimizer, warmup_steps, num_training_steps)
        self._created_lr_scheduler = True  # as Trainer marks a schedule it made: a second train() builds a new one
        return self.lr_scheduler


class ModelFlopsCallback(TrainerCallback):
    """Counts the model FLOPs of what the model trains on (`flops.finetuning_flops_per_token` for its task head),
    from each training forward's input shape: padding included, and nothing read from the device. `take()` gives
    the FLOPs and seconds since the last call (or since training began)."""

    def __init__(self, model, clock=time.perf_counter):
        name = type(model).__name__
        self.head = next((head for head in HEADS if name.endswith("For" + head.title().replace("_", ""))), None)
        self.config, self.clock = model.config, clock
        self.per_token: dict[int, float] = {}  # by sequence length
        self.flops, self.since, self.hook = 0.0, clock(), None

    def on_train_begin(self, args: TrainingArguments, state, control, model=None, **kwargs):
        if self.head is not None and self.hook is None:
            self.hook = model.register_forward_pre_hook(self.count, with_kwargs=True)
        self.flops, self.since = 0.0, self.clock()

    def on_train_end(self, args: TrainingArguments, state, control, **kwargs):
        if self.hook is not None:
            self.hook.remove()
            self.hook = None

    def count(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        if not module.training:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        shape = ids.shape if ids is not None else kwargs["inputs_embeds"].shape[:-1]
        length = shape[-1]
        if length not in self.per_token:
            self.per_token[length] = finetuning_flops_per_token(
                self.config, length, self.head, getattr(self.config, "num_labels", 2)
            )
        self.flops += shape.numel() * self.per_token[length]

    def take(self) -> tuple[float, float]:
        now = self.clock()
        taken = (self.flops, now - self.since)
        self.flops, self.since = 0.0, now
        return taken


class ModelCodeCallback(TrainerCallback):
    """--hub_strategy every_save / checkpoint / all_checkpoints: as each push begins, the model code that the
    config's auto_map names (the checkpoint's *.py files) is copied into output_dir beside the weights, config and
    tokenizer Trainer copies there, so that every pushed revision loads."""

    def on_push_begin(self, args: TrainingArguments, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            for path in checkpoint.glob("*.py"):
                shutil.copy(path, Path(args.output_dir) / path.name)


class StopOnSignalCallback(TrainerCallback):
    """SIGTERM, SIGINT or SIGUSR1 (in any process) ends training after the current optimizer step, with a
    checkpoint-N that Trainer's --resume_from_checkpoint continues from (`runtime/preemption.py`)."""

    def __init__(self, stop: StopOnSignal):
        self.stop = stop
        self.stopped_at: int | None = None  # the step after which it stopped training (the same in every process)

    def on_step_end(self, args: TrainingArguments, state, control, **kwargs):
        if self.stop.shared_signal(args.device):  # every process asks at every step: they agree on the same step
            control.should_save = control.should_training_stop = True
            self.stopped_at = state.global_step
