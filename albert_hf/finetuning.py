"""What run_glue.py, run_squad.py and run_race.py share: arguments, loading, the train/evaluate flow, outputs.

Each script defines only its task's data arguments, preprocessing, metrics and predictions, and calls:

    model_args, data_args, training_args = parse_arguments(DataArguments, argv)
    last_checkpoint = setup(training_args)
    tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForSequenceClassification, num_labels=3)
    trainer = AlbertTrainer(model=model, args=training_args, processing_class=tokenizer, ...)
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, num_train_examples)
    if training_args.do_eval:
        metrics = evaluate_splits(trainer, {"validation": eval_dataset})
    finish(trainer, model_args, training_args, tasks="text-classification", dataset="glue")

Any albert_hf checkpoint works, and any transformers ALBERT checkpoint (model_type "albert", e.g.
`albert/albert-base-v2` or a local copy) is converted on load: the weight names are the same.
"""

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import transformers
from transformers import AutoTokenizer, HfArgumentParser, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

from . import AlbertHFConfig
from .hub import loading
from .optimization import AdamWeightDecay, get_official_schedule, parameter_groups

logger = logging.getLogger("albert_hf.finetuning")


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
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "re-initialise head weights whose shape differs (e.g. another label count)"}
    )
    hidden_dropout_prob: float | None = field(
        default=None, metadata={"help": "ALBERT dropout for fine-tuning (the paper's 'ALBERT DR'); default: config's"}
    )
    classifier_dropout_prob: float | None = field(
        default=None, metadata={"help": "dropout before the task head (official: 0.1); default: config's"}
    )

    def source(self, part: str) -> tuple[str, str]:
        """(flag, value) the "config" or "tokenizer" is loaded from: its own argument, else the model's."""
        own = getattr(self, f"{part}_name")
        return (f"--{part}_name", own) if own else ("--model_name_or_path", self.model_name_or_path)


@dataclass
class AlbertTrainingArguments(TrainingArguments):
    """transformers' TrainingArguments plus three options of ours."""

    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "start over even if output_dir holds a checkpoint of an earlier run"}
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

    def __post_init__(self):
        super().__post_init__()
        if self.compile_blocks and self.torch_compile:
            raise ValueError("--compile_blocks and --torch_compile both compile the model: pass one of them")


class AlbertTrainer(Trainer):
    """Trainer that, with --official_optimizer, builds the official optimizer and schedule (ALBERT_SPEC.md §5.1).

    Otherwise it is transformers' Trainer unchanged. Task trainers (e.g. for SQuAD post-processing) subclass it.
    With --compile_blocks the model's blocks are compiled in place before training.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self.args, "compile_blocks", False):
            self.model.compile_blocks()

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


def parse_arguments(data_arguments_class, argv=None):
    """(ModelArguments, data arguments, AlbertTrainingArguments) from the command line, or from one .json file."""
    parser = HfArgumentParser((ModelArguments, data_arguments_class, AlbertTrainingArguments))
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def setup(training_args: TrainingArguments) -> str | None:
    """Logging, seed, and the checkpoint to resume from (None to start fresh).

    An output_dir that already holds a run is never silently overwritten: its last checkpoint is resumed, or
    the run stops unless --overwrite_output_dir is given.
    """
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if training_args.should_log else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    set_seed(training_args.seed)
    output_dir = Path(training_args.output_dir)
    last_checkpoint = None
    if training_args.do_train and output_dir.is_dir() and not getattr(training_args, "overwrite_output_dir", False):
        last_checkpoint = get_last_checkpoint(str(output_dir))
        if training_args.resume_from_checkpoint:
            last_checkpoint = training_args.resume_from_checkpoint
        elif last_checkpoint is None and any(p.suffix in (".safetensors", ".bin") for p in output_dir.iterdir()):
            raise SystemExit(f"error: {output_dir} already holds a trained model; pass --overwrite_output_dir to "
                             "replace it, or another --output_dir")
        if last_checkpoint is not None:
            logger.info("Resuming from %s (pass --overwrite_output_dir to start over)", last_checkpoint)
    return last_checkpoint


def load_tokenizer_and_model(model_args: ModelArguments, model_class, **config_overrides):
    """Tokenizer and `model_class` (an AlbertHFFor* class) from model_args; config fields may be overridden."""
    hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token)
    flag, tokenizer_name = model_args.source("tokenizer")
    with loading(flag, tokenizer_name):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=model_args.trust_remote_code, **hub)
    if "token_type_ids" not in tokenizer.model_input_names:
        # transformers' AlbertTokenizer leaves them out by default; ALBERT's segment embeddings need them.
        tokenizer.model_input_names = [*tokenizer.model_input_names, "token_type_ids"]
    for name in ("hidden_dropout_prob", "classifier_dropout_prob"):
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
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
                         f"{model.config.vocab_size}: they do not belong together")
    return tokenizer, model


def check_columns(dataset, required, where: str) -> None:
    """Stop with the file/split and the missing column named, before any preprocessing runs."""
    missing = [name for name in required if name not in dataset.column_names]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}; found {dataset.column_names}")


def limit(dataset, max_samples: int | None):
    return dataset if max_samples is None else dataset.select(range(min(max_samples, len(dataset))))


def train(trainer, training_args, last_checkpoint, num_examples: int) -> dict:
    """Train (resuming if asked), save the final model with its tokenizer, write train_results.json."""
    result = trainer.train(resume_from_checkpoint=last_checkpoint)
    trainer.save_model()
    metrics = {**result.metrics, "train_samples": num_examples}
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def evaluate_splits(trainer, splits: dict, evaluate=None) -> dict:
    """Evaluate each named split; write eval_results.json as {split: metrics}. Returns that dict.

    `evaluate(trainer, name, dataset) -> metrics` replaces `trainer.evaluate` for tasks with post-processing.
    """
    results = {}
    for name, dataset in splits.items():
        if evaluate is None:
            metrics = trainer.evaluate(eval_dataset=dataset, metric_key_prefix="eval")
        else:
            metrics = evaluate(trainer, name, dataset)
        metrics["eval_samples"] = len(dataset)
        trainer.log_metrics(f"eval_{name}", metrics)
        results[name] = metrics
    if trainer.is_world_process_zero():
        path = Path(trainer.args.output_dir) / "eval_results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return results


def finish(trainer, model_args: ModelArguments, training_args, **card):
    """Write the model card (README.md) and push the output folder when --push_to_hub is set."""
    card.setdefault("finetuned_from", model_args.model_name_or_path)
    card.setdefault("tags", ["albert", "albert_hf"])
    if training_args.push_to_hub:
        trainer.push_to_hub(**card)
    elif trainer.is_world_process_zero():
        trainer.create_model_card(**card)
