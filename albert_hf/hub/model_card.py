"""Model cards (README.md) for every output folder, written with huggingface_hub's ModelCard / ModelCardData /
EvalResult. Nothing here contacts the Hub: which names are Hub names and which files hold which dataset is decided
from local facts only.

Each fine-tuning script's data arguments say what its card needs: `PIPELINE_TAG`, `AUTO_CLASS`, `SCRIPT`,
`card_tags()` and `card_dataset(wanted)` (what the Data section says, and which Hub dataset it is), beside the
task's own code (tasks/glue/job.py, tasks/squad/job.py, tasks/race/, tasks/ner.py).
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only: the card writers need no transformers import
    from transformers import TrainingArguments

# Older Hub names of the datasets the scripts read -> the ids they live under now (listed under `datasets`).
HUB_DATASET_IDS = {"glue": "nyu-mll/glue", "squad": "rajpurkar/squad", "squad_v2": "rajpurkar/squad_v2",
                   "race": "ehovy/race"}
TASK_NAMES = {"fill-mask": "Fill-Mask", "text-classification": "Text Classification",
              "question-answering": "Question Answering", "multiple-choice": "Multiple Choice",
              "token-classification": "Token Classification", "feature-extraction": "Feature Extraction"}
# model-index `dataset.type` for data that is no Hub dataset (arbitrary local files, the embedded corpus)
LOCAL_DATASET_TYPE = "local"
PLACEHOLDER = "<this repo or folder>"
# result keys (after the eval_/predict_ prefix) that count or time things rather than measure the model
_BOOKKEEPING = {"runtime", "samples_per_second", "steps_per_second", "samples", "features", "epoch", "total",
                "combined_score", "null_threshold"}
_ABBREVIATIONS = {"mlm": "MLM", "sop": "SOP", "nsp": "NSP"}


def _format(value):
    return f"{value:.4g}" if isinstance(value, float) else value


def _table(rows: dict) -> str:
    lines = ["| | |", "|---|---|"]
    for key, value in rows.items():
        lines.append(f"| {key} | {_format(value)} |")
    return "\n".join(lines)


def hub_dataset_id(name: str | None) -> str | None:
    return HUB_DATASET_IDS.get(name, name) if name else None


def hub_model_name(name) -> str | None:
    """`name` when it names a Hub model (no local folder or file by that name, and a valid repo id), else None."""
    if not name or Path(str(name)).expanduser().exists():
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(str(name))
    except HFValidationError:
        return None
    return str(name)


def _folder_name(path) -> str:
    return Path(str(path)).expanduser().absolute().name


def _describe_checkpoint(name) -> str:
    if hub_model_name(name):
        return f"[{name}](https://huggingface.co/{name})"
    return f"a local checkpoint, the folder `{_folder_name(name)}` (not a Hub model, so no `base_model` is listed)"


def read_results(output_dir) -> dict:
    """The run's final results: output_dir/all_results.json (flat: train_*, eval_*, predict_* keys), or {}."""
    path = Path(output_dir) / "all_results.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


@dataclass
class CardDataset:
    """What a card says about the data: the Data section, the `datasets` entry, and the splits results come from."""

    name: str  # pretty name, e.g. "GLUE MRPC"
    description: str  # markdown for the Data section
    hub_id: str | None = None  # a Hub dataset: the data came from it, or is it, read from files in its official format
    config: str | None = None
    splits: dict = field(default_factory=lambda: {"eval_": "validation", "predict_": "test"})  # key prefix -> split
    suffixes: dict = field(default_factory=dict)  # key suffix -> split (MNLI: "_mm" -> validation_mismatched)

    def split_and_metric(self, key: str):
        """("validation", "accuracy") for "eval_accuracy"; (None, None) for keys of no evaluated split."""
        for prefix, split in self.splits.items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                for suffix, other in self.suffixes.items():
                    if name.endswith(suffix):
                        return other, name[: -len(suffix)]
                return split, name
        return None, None


def _is_metric(name: str, with_loss: bool) -> bool:
    if name in _BOOKKEEPING or name.endswith(("_total", "_thresh", "_threshold")) or name.startswith("num_"):
        return False
    return with_loss or not name.endswith("loss")


def _metric_type(name: str) -> str:
    if name in ("exact", "exact_match") or name.endswith("_exact"):
        return "exact_match"
    if name.endswith("f1"):
        return "f1"
    if name.startswith("accuracy") or name.endswith("_accuracy"):
        return "accuracy"
    if name.endswith("loss"):
        return "loss"
    return {"pearson": "pearsonr"}.get(name, name)


def _metric_name(name: str) -> str:
    return " ".join(_ABBREVIATIONS.get(word, word) for word in name.split("_"))


def eval_results(results: dict, dataset: CardDataset, task_type: str, task_name: str | None = None,
                 with_loss: bool = False, keep=lambda metric: True) -> list:
    """EvalResults (the model-index) of the metrics among `results` (all_results.json keys) that `dataset` has a
    split for; `keep(metric name)` narrows them further."""
    from huggingface_hub import EvalResult

    found = []
    for key, value in results.items():
        split, name = dataset.split_and_metric(key)
        if (split is None or not _is_metric(name, with_loss) or not keep(name) or isinstance(value, bool)
                or not isinstance(value, (int, float)) or not math.isfinite(value)):
            continue
        found.append(EvalResult(
            task_type=task_type, task_name=task_name or TASK_NAMES.get(task_type, task_type),
            dataset_type=dataset.hub_id or LOCAL_DATASET_TYPE, dataset_name=dataset.name,
            dataset_config=dataset.config, dataset_split=split, metric_type=_metric_type(name),
            metric_name=_metric_name(name), metric_value=value))
    return found


def _usage(auto_class: str, repo: str, remote_code: bool, tokenizer_from: str | None) -> list[str]:
    trust = ", trust_remote_code=True" if remote_code else ""
    # AutoTokenizer reads config.json first, and an albert_hf config is remote code: without trust_remote_code it
    # asks "Do you wish to run the custom code?". The tokenizer itself is transformers' AlbertTokenizer, which
    # loads the folder directly, with no remote code and no question.
    tokenizer_class = "AlbertTokenizer" if remote_code else "AutoTokenizer"
    lines = ["## Usage", "", "```python", f"from transformers import {auto_class}, {tokenizer_class}", "",
             f'tokenizer = {tokenizer_class}.from_pretrained("{tokenizer_from or repo}")',
             f'model = {auto_class}.from_pretrained("{repo}"{trust})', "```", ""]
    if tokenizer_from:
        lines += [f"No tokenizer files came with the weights: use the source's, `{tokenizer_from}`.", ""]
    if remote_code:
        lines += ["The model code ships with the checkpoint (`modeling_albert_hf.py`, hence `trust_remote_code=True`), "
                  "so `albert_hf` need not be installed. The tokenizer is transformers' own `AlbertTokenizer` and "
                  "needs no remote code; `AutoTokenizer` works too, with `trust_remote_code=True` (it reads the "
                  "model's config first, and would otherwise ask whether to run the config's code).", ""]
    else:
        lines += ["A transformers ALBERT checkpoint (model_type `albert`): no remote code is needed.", ""]
    return lines


def _architecture(model) -> dict:
    config = model.config
    rows = {"architecture": (config.architectures or [type(model).__name__])[0],
            "parameters": f"{sum(p.numel() for p in model.parameters()):,}"}
    for key, attribute in [("vocab_size (V)", "vocab_size"), ("embedding_size (E)", "embedding_size"),
                           ("hidden_size (H)", "hidden_size"), ("num_hidden_layers (L)", "num_hidden_layers"),
                           ("num_hidden_groups (G)", "num_hidden_groups"), ("inner_group_num (K)", "inner_group_num"),
                           ("num_attention_heads", "num_attention_heads"), ("intermediate_size", "intermediate_size"),
                           ("sharing", "sharing"), ("hidden_act", "hidden_act"),
                           ("max_position_embeddings", "max_position_embeddings")]:
        if getattr(config, attribute, None) is not None:
            rows[key] = getattr(config, attribute)
    return rows


def write_model_card(
    output_dir,
    *,
    title: str,
    summary: str,
    model,
    pipeline_tag: str,
    data: str | None = None,
    training: dict | None = None,
    metrics: dict | None = None,
    tags=(),
    usage_class: str = "AutoModel",
    remote_code: bool = True,
    tokenizer_from: str | None = None,
    repo: str | None = None,
    license: str | None = None,
    base_model: str | None = None,
    datasets=None,
    language=None,
    eval_results=None,
    model_name: str | None = None,
    sections=(),
) -> Path:
    """Write README.md (the Hub model card): metadata (library, pipeline tag, tags, license, base model, datasets,
    model-index) and text: what the model is, how to load it and its tokenizer, its config and size, data,
    training, results, then `sections`.

    Args:
        output_dir (`str` or `os.PathLike`): the model's folder, where README.md is written.
        title (`str`): the card's heading.
        summary (`str`): the opening paragraph, markdown.
        model (`PreTrainedModel`): the model; its config and parameter count fill the Configuration table.
        pipeline_tag (`str`): the Hub pipeline tag, e.g. `"fill-mask"`.
        data (`str`, *optional*): the Data section, markdown; None leaves it out.
        training (`dict`, *optional*): the Training table's rows; None leaves it out.
        metrics (`dict`, *optional*): the Results table's rows; None leaves it out, {} says no evaluation was run.
        tags (iterable of `str`, defaults to `()`): tags after "albert" and "albert_hf".
        usage_class (`str`, defaults to `"AutoModel"`): the Auto class of the Usage snippet.
        remote_code (`bool`, defaults to `True`): an albert_hf checkpoint, loaded with `trust_remote_code=True`;
            False: a transformers ALBERT checkpoint.
        tokenizer_from (`str`, *optional*): where the Usage snippet loads the tokenizer from, when the folder has none.
        repo (`str`, *optional*): the repo id of the Usage snippet; default PLACEHOLDER.
        license (`str`, *optional*): a Hub license id.
        base_model (`str`, *optional*): the Hub model it was trained from.
        datasets (iterable of `str`, *optional*): Hub dataset ids.
        language (`str` or `list[str]`, *optional*): the language code(s), e.g. `"en"`.
        eval_results (list of `EvalResult`, *optional*): the model-index's entries (the module's `eval_results`).
        model_name (`str`, *optional*): the model-index's name, with `eval_results`; default the folder's name.
        sections (iterable of `(str, str)`, defaults to `()`): (heading, markdown) sections after the others.

    Returns:
        `Path`: the card written, output_dir/README.md.
    """
    from huggingface_hub import ModelCard, ModelCardData

    if eval_results and not model_name:
        model_name = Path(output_dir).absolute().name
    card_data = ModelCardData(
        library_name="transformers", pipeline_tag=pipeline_tag, tags=["albert", "albert_hf", *tags],
        license=license or None, base_model=base_model or None, datasets=list(datasets) if datasets else None,
        language=language or None, model_name=model_name if eval_results else None,
        eval_results=list(eval_results) if eval_results else None,
    )
    text = [f"# {title}", "", summary, ""]
    text += _usage(usage_class, repo or PLACEHOLDER, remote_code, tokenizer_from)
    text += ["## Configuration", "", _table(_architecture(model)), ""]
    if data is not None:
        text += ["## Data", "", data, ""]
    if training is not None:
        text += ["## Training", "", _table(training), ""]
    if metrics is not None:
        text += ["## Results", "", _table(metrics) if metrics else "No evaluation was run.", ""]
    for heading, body in sections:
        text += [f"## {heading}", "", body, ""]
    card = ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(text))
    path = Path(output_dir) / "README.md"
    card.save(path)
    return path


def _framework_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("albert_hf", "transformers", "torch", "datasets", "tokenizers", "accelerate", "huggingface_hub"):
        try:
            found.append(f"- {package} {version(package)}")
        except PackageNotFoundError:
            pass
    return "\n".join(found)


# --- pretraining


@dataclass(frozen=True)
class PretrainingRun:
    """What the card of a `run_pretraining.py` model says of its run, each value named (the job fills it in)."""

    dataset: CardDataset  # the corpus, as the Data section describes it
    task: str  # sop, nsp or none
    max_ngram: int
    max_train_steps: int
    max_seq_length: int
    micro_batch: str  # e.g. "8 x 4 accumulation", and how it was chosen when --auto_find_batch_size found it
    optimizer: str
    learning_rate: float
    num_warmup_steps: int
    mixed_precision: str  # as asked; the card shows the precision the run had where `where` says it
    seed: int
    architecture: str  # the preset's name, or "custom" for a --config_name
    base_model: str | None  # --model_name_or_path: pretraining continued from it
    hub_model_id: str | None
    license: str | None
    output_dir: str


CURVES_SECTION = ("Training curves", "![Training curves](training_curves.png)")


def write_pretraining_card(output_dir, model, facts: PretrainingRun, global_batch: int, num_processes: int,
                           curves: bool = False, where: dict | None = None) -> Path:
    """The card of a `run_pretraining.py` model, with the metrics of output_dir/all_results.json (the held-out
    baselines among them, `*_baseline`) and, with `curves`, training_curves.png.

    Args:
        output_dir (`str` or `os.PathLike`): the model's folder, with its all_results.json.
        model (`PreTrainedModel`): the pretrained model.
        facts (`PretrainingRun`): what the run did (data, objective, optimisation, --license, --hub_model_id).
        global_batch (`int`): sequences per optimizer step, over all processes.
        num_processes (`int`): the run's processes.
        curves (`bool`, defaults to `False`): add the Training curves section (training_curves.png, in the folder).
        where (`dict`, *optional*): the hardware and precision of the run (`final_folder.where_trained`).

    Returns:
        `Path`: the card written, output_dir/README.md.
    """
    results = read_results(output_dir)
    dataset = facts.dataset
    pair = {"sop": "sentence-order prediction", "nsp": "next-sentence prediction"}.get(facts.task)
    objective = "masked language modelling with n-gram masking" + (f" and {pair}" if pair else "")
    # the model-index lists the model's results; the baselines stay in the Results table beside them
    found = eval_results(results, dataset, "fill-mask", "Masked language modelling", with_loss=True,
                         keep=lambda name: name.startswith("mlm") and not name.endswith("_baseline"))
    if pair:  # the 2-way head classifies a pair of segments
        found += eval_results(results, dataset, "text-classification", pair.capitalize(), with_loss=True,
                              keep=lambda name: name.startswith(facts.task) and not name.endswith("_baseline"))
    summary = (f"An ALBERT model (Lan et al., ICLR 2020) pretrained with albert_hf's `run_pretraining.py`: "
               f"{objective}.")
    if facts.base_model:
        summary += f" Pretraining continued from {_describe_checkpoint(facts.base_model)}."
    training = {"objective": f"MLM (n-gram, max n={facts.max_ngram}) + {facts.task.upper()}"
                if facts.task != "none" else "MLM only",
                "steps": facts.max_train_steps, "global batch": global_batch, "micro-batch": facts.micro_batch,
                "sequence length": facts.max_seq_length,
                "optimizer": facts.optimizer.upper(), "peak learning rate": facts.learning_rate,
                "warmup steps": facts.num_warmup_steps, "processes": num_processes,
                "mixed precision": (where or {}).get("precision", facts.mixed_precision), "seed": facts.seed,
                **({"hardware": where["hardware"]} if where else {})}
    return write_model_card(
        output_dir, title=f"ALBERT ({facts.architecture}) pretrained with albert_hf", summary=summary, model=model,
        pipeline_tag="fill-mask", tags=("pretraining", facts.task), usage_class="AutoModelForPreTraining",
        data=dataset.description, training=training, repo=facts.hub_model_id,
        metrics={key: value for key, value in results.items() if not isinstance(value, str)},  # not where it ran
        license=facts.license, base_model=hub_model_name(facts.base_model), datasets=[dataset.hub_id]
        if dataset.hub_id else None, eval_results=found,
        model_name=(facts.hub_model_id or Path(facts.output_dir).absolute().name).split("/")[-1],
        sections=([CURVES_SECTION] if curves else []) + [("Framework versions", _framework_versions())],
    )


# --- fine-tuning (run_glue.py, run_squad.py, run_race.py, run_ner.py): what the tasks' card_dataset use

def limits(data_args, wanted) -> str:
    caps = [(split, getattr(data_args, f"max_{kind}_samples", None))
            for split, kind in (("train", "train"), ("validation", "eval"), ("test", "predict")) if split in wanted]
    caps = [f"{split}: the first {cap}" for split, cap in caps if cap]
    return f" Only part of the data was used ({'; '.join(caps)} examples)." if caps else ""


def from_sources(name, sources: dict, config, extra: str, **splits) -> CardDataset:
    """sources: split -> (Hub dataset id or None, how it was read). One dataset id for every split is listed;
    files in the official format count as that dataset; anything else is described as local files."""
    ids = {hub_id for hub_id, _ in sources.values()}
    hub_id = ids.pop() if len(ids) == 1 else None
    read = "; ".join(f"{split}: {how}" for split, (_, how) in sources.items()) or "no data was read in this run"
    if hub_id:
        where = f"[{hub_id}](https://huggingface.co/datasets/{hub_id})" + (f", config `{config}`" if config else "")
        description = f"{name}, {where}. Read from: {read}.{extra}"
        return CardDataset(name, description, hub_id, config, **splits)
    description = f"Local data in the format of {name}, not a Hub dataset; read from: {read}.{extra}"
    return CardDataset(f"{name} (local files)", description, None, None, **splits)


def user_data(data_args, wanted, extra: str) -> CardDataset:
    """A user's own data (run_glue.py without a task, run_ner.py): --*_file files, or a --dataset_name that is a
    Hub dataset or a local folder."""
    files = {split: getattr(data_args, f"{split}_file") for split in wanted}
    local = any(files.values()) or Path(data_args.dataset_name).exists()
    hub_id = None if local else hub_dataset_id(data_args.dataset_name)
    sources = {split: (hub_id, f"`{Path(path).name}`" if path else f"`{data_args.dataset_name}` ({split})")
               for split, path in files.items() if path or data_args.dataset_name}
    if hub_id:
        return from_sources(data_args.dataset_name, sources, data_args.dataset_config_name, extra)
    read = "; ".join(f"{split}: {how}" for split, (_, how) in sources.items())
    name = "local files" if any(files.values()) else Path(data_args.dataset_name).name
    return CardDataset(name, f"The user's own data, not a Hub dataset; read from: {read}.{extra}")


def _training_log(log_history) -> str | None:
    """Training loss and evaluations during training, by step (as in transformers' Trainer cards). The log ends
    at Trainer's summary entry (train_runtime): the final evaluations that follow are in the Results section."""
    rows = {}
    for entry in log_history:
        if "train_runtime" in entry:
            break
        values = {"training loss": entry["loss"]} if "loss" in entry else {}
        values.update({f"validation {_metric_name(key[5:])}": value for key, value in entry.items()
                       if key.startswith("eval_") and _is_metric(key[5:], with_loss=True)
                       and isinstance(value, (int, float))})
        if values and "step" in entry:
            rows.setdefault(entry["step"], {"epoch": entry.get("epoch")}).update(values)
    if not rows:
        return None
    columns = ["epoch"] + list(dict.fromkeys(key for row in rows.values() for key in row if key != "epoch"))
    lines = ["| step | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for step, row in rows.items():
        cells = ["" if row.get(column) is None else _format(row[column]) for column in columns]
        lines.append(f"| {step} | " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def _finetuning_training(trainer, model_args, args: "TrainingArguments") -> dict:
    official = getattr(args, "official_optimizer", False)
    optimizer = ("AdamWeightDecay (official: no bias correction, decoupled weight decay)" if official
                 else f"{getattr(args.optim, 'value', args.optim)} (betas {args.adam_beta1}, {args.adam_beta2})")
    schedule = ("linear warm-up, then linear decay to 0 (official)" if official
                else str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)))
    config = trainer.model.config
    return {
        "starting checkpoint": model_args.model_name_or_path if hub_model_name(model_args.model_name_or_path)
        else f"local folder `{_folder_name(model_args.model_name_or_path)}`",
        "optimizer": optimizer, "peak learning rate": args.learning_rate, "schedule": schedule,
        "warmup steps": args.warmup_steps, "weight decay": args.weight_decay, "epsilon": args.adam_epsilon,
        "max grad norm": args.max_grad_norm,
        "batch size": args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1),
        "steps": trainer.state.global_step, "epochs": round(trainer.state.epoch or 0.0, 2),
        "processes": args.world_size, "mixed precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "no",
        "hidden dropout": getattr(config, "hidden_dropout_prob", None),
        "classifier dropout": getattr(config, "classifier_dropout_prob", None), "seed": args.seed,
    }


def _paper_recipe_section(recipe) -> str:
    rows = {name: f"{_format(value)} (explicit)" if name in recipe.explicit else value
            for name, value in recipe.values.items()}
    return (f"Trained with `--paper_hparams`: ALBERT's fine-tuning recipe for {recipe.name}, as used (also in "
            "`paper_hparams.json`); \"explicit\" marks values given on the command line instead of the "
            "recipe's.\n\n" + _table(rows))


def write_finetuned_card(trainer, model_args, training_args, data_args, splits: list[str],
                         paper_recipe=None, dataset: CardDataset | None = None) -> Path:
    """The card of a model fine-tuned by run_glue.py / run_squad.py / run_race.py / run_ner.py, with the metrics of
    output_dir/all_results.json, the license of --license and the resolved --paper_hparams recipe
    (`tasks.recipe.PaperRecipe`) when given.

    Args:
        splits: the splits the run used ("train", "validation", "test"), which the card's dataset names.
        dataset: the card's Data section; default `data_args.card_dataset(splits)`.

    Returns:
        The path of the card written, output_dir/README.md.
    """
    pipeline_tag, script = data_args.PIPELINE_TAG, data_args.SCRIPT
    output_dir = Path(training_args.output_dir)
    dataset = dataset or data_args.card_dataset(splits)
    results = read_results(output_dir)
    found = eval_results(results, dataset, pipeline_tag)
    base = model_args.model_name_or_path
    summary = (f"ALBERT fine-tuned for {TASK_NAMES[pipeline_tag].lower()} on {dataset.name} with albert_hf's "
               f"`{script}`, starting from {_describe_checkpoint(base)}.")
    if found:
        summary += " Final results: " + ", ".join(
            f"{result.metric_name} {_format(result.metric_value)} ({result.dataset_split})" for result in found) + "."
    sections = []
    if paper_recipe is not None:
        sections.append(("Recipe", _paper_recipe_section(paper_recipe)))
    if (output_dir / "training_curves.png").is_file():
        sections.append(CURVES_SECTION)
    log = _training_log(trainer.state.log_history)
    if log:
        sections.append(("Training log", log))
    sections.append(("Framework versions", _framework_versions()))
    model_name = (training_args.hub_model_id or output_dir.absolute().name).split("/")[-1]
    return write_model_card(
        output_dir, title=model_name, summary=summary, model=trainer.model, pipeline_tag=pipeline_tag,
        tags=[pipeline_tag, *data_args.card_tags()], usage_class=data_args.AUTO_CLASS,
        repo=training_args.hub_model_id, data=dataset.description,
        training=_finetuning_training(trainer, model_args, training_args), metrics=results,
        license=model_args.license,
        base_model=hub_model_name(base), datasets=[dataset.hub_id] if dataset.hub_id else None,
        language="en", eval_results=found, model_name=model_name, sections=sections,
    )


# --- conversion (python -m albert_hf.convert)

# architecture suffix -> (pipeline tag, Auto class)
_HEADS = {"ForPreTraining": ("fill-mask", "AutoModelForPreTraining"),
          "ForMaskedLM": ("fill-mask", "AutoModelForMaskedLM"),
          "ForSequenceClassification": ("text-classification", "AutoModelForSequenceClassification"),
          "ForMultipleChoice": ("multiple-choice", "AutoModelForMultipleChoice"),
          "ForQuestionAnswering": ("question-answering", "AutoModelForQuestionAnswering"),
          "ForQuestionAnsweringWithAnswerability": ("question-answering", "AutoModelForQuestionAnswering"),
          "ForTokenClassification": ("token-classification", "AutoModelForTokenClassification")}


def write_converted_card(out_dir, *, source: str, target: str, model, tokenizer_copied: bool,
                         license: str | None = None) -> Path:
    """The card of a `python -m albert_hf.convert` output. A local source's card metadata (license, datasets,
    language, base model, model-index) is carried over, the weights being the same; a Hub source becomes the
    base model (its card is not fetched: nothing here goes online).

    Args:
        out_dir (`str` or `os.PathLike`): the converted model's folder.
        source (`str`): what was converted: a local folder (its README.md is read when there is one) or a Hub name.
        target (`str`): the format converted to, `"albert_hf"` or `"transformers"`.
        model (`PreTrainedModel`): the converted model; its architecture gives the pipeline tag and the Auto class.
        tokenizer_copied (`bool`): whether tokenizer files came with it; False: the Usage snippet names where to get
            one.
        license (`str`, *optional*): a Hub license id; default the source card's.

    Returns:
        `Path`: the card written, out_dir/README.md.
    """
    from huggingface_hub import ModelCard

    architecture = (model.config.architectures or [type(model).__name__])[0]
    head = next((suffix for suffix in sorted(_HEADS, key=len, reverse=True) if architecture.endswith(suffix)), None)
    pipeline_tag, auto_class = _HEADS.get(head, ("feature-extraction", "AutoModel"))
    carried, source_card = {}, Path(source) / "README.md"
    if source_card.is_file():
        data = ModelCard.load(source_card, ignore_metadata_errors=True).data
        carried = {key: getattr(data, key, None) for key in ("license", "datasets", "language", "base_model",
                                                             "eval_results") if getattr(data, key, None)}
    found = carried.get("eval_results") or []
    formats = {"albert_hf": "albert_hf (model_type `albert_hf`, code shipped with the checkpoint)",
               "transformers": "transformers' ALBERT (model_type `albert`)"}
    summary = (f"`{_folder_name(source) if Path(source).exists() else source}` converted to {formats[target]} with "
               "`python -m albert_hf.convert`: the same weights under a translated config.")
    if carried:
        summary += (" The source's card metadata (license, datasets, base model, evaluation results) is carried "
                    "over; see the source's card for how it was trained.")
    metrics = {f"{r.dataset_name} {r.dataset_split or ''} {r.metric_name or r.metric_type}".replace("  ", " "):
               r.metric_value for r in found} if found else None
    return write_model_card(
        out_dir, title=f"{architecture} (converted by albert_hf)", summary=summary, model=model,
        pipeline_tag=pipeline_tag, tags=(pipeline_tag, "converted"), usage_class=auto_class,
        remote_code=target == "albert_hf", metrics=metrics,
        tokenizer_from=None if tokenizer_copied else hub_model_name(source) or f"<tokenizer of {_folder_name(source)}>",
        license=license or carried.get("license"), base_model=carried.get("base_model") or hub_model_name(source),
        datasets=carried.get("datasets"), language=carried.get("language"), eval_results=found or None,
        model_name=Path(out_dir).absolute().name,
    )


