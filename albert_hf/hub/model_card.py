"""Model cards (README.md) for every output folder, written with huggingface_hub's ModelCard / ModelCardData /
EvalResult. Nothing here contacts the Hub: which names are Hub names and which files hold which dataset is decided
from local facts only.

A card's content is one `CardContent`, built by each job beside itself (pretraining/output/pretraining_card.py,
tasks/finetuned_card.py, convert/converted_card.py, average/averaging.py) and rendered here (`write_model_card`).
Each fine-tuning script's data arguments say what its card needs: `PIPELINE_TAG`, `AUTO_CLASS`, `SCRIPT`,
`card_tags()` and `card_dataset(wanted)` (what the Data section says, and which Hub dataset it is), beside the
task's own package (tasks/glue/, tasks/squad/, tasks/race/, tasks/ner/, tasks/own_data/).
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# Older Hub names of the datasets the scripts read -> the ids they live under now (listed under `datasets`).
HUB_DATASET_IDS = {
    "glue": "nyu-mll/glue",
    "squad": "rajpurkar/squad",
    "squad_v2": "rajpurkar/squad_v2",
    "race": "ehovy/race",
}
TASK_NAMES = {
    "fill-mask": "Fill-Mask",
    "text-classification": "Text Classification",
    "question-answering": "Question Answering",
    "multiple-choice": "Multiple Choice",
    "token-classification": "Token Classification",
    "feature-extraction": "Feature Extraction",
}
# model-index `dataset.type` for data that is no Hub dataset (arbitrary local files, the embedded corpus)
LOCAL_DATASET_TYPE = "local"
PLACEHOLDER = "<this repo or folder>"
# result keys (after the eval_/predict_ prefix) that count or time things rather than measure the model
_BOOKKEEPING = {
    "runtime",
    "samples_per_second",
    "steps_per_second",
    "samples",
    "features",
    "epoch",
    "total",
    "combined_score",
    "null_threshold",
}
_ABBREVIATIONS = {"mlm": "MLM", "sop": "SOP", "nsp": "NSP"}


def format_value(value):
    return f"{value:.4g}" if isinstance(value, float) else value


def markdown_table(rows: dict) -> str:
    lines = ["| | |", "|---|---|"]
    for key, value in rows.items():
        lines.append(f"| {key} | {format_value(value)} |")
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


def folder_name(path) -> str:
    return Path(str(path)).expanduser().absolute().name


def describe_checkpoint(name) -> str:
    if hub_model_name(name):
        return f"[{name}](https://huggingface.co/{name})"
    return f"a local checkpoint, the folder `{folder_name(name)}` (not a Hub model, so no `base_model` is listed)"


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
                name = key[len(prefix) :]
                for suffix, other in self.suffixes.items():
                    if name.endswith(suffix):
                        return other, name[: -len(suffix)]
                return split, name
        return None, None


def is_metric(name: str, with_loss: bool) -> bool:
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


def metric_name(name: str) -> str:
    return " ".join(_ABBREVIATIONS.get(word, word) for word in name.split("_"))


def eval_results(
    results: dict,
    dataset: CardDataset,
    task_type: str,
    task_name: str | None = None,
    with_loss: bool = False,
    keep=lambda metric: True,
) -> list:
    """EvalResults (the model-index) of the metrics among `results` (all_results.json keys) that `dataset` has a
    split for; `keep(metric name)` narrows them further."""
    from huggingface_hub import EvalResult

    found = []
    for key, value in results.items():
        split, name = dataset.split_and_metric(key)
        if (
            split is None
            or not is_metric(name, with_loss)
            or not keep(name)
            or isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            continue
        found.append(
            EvalResult(
                task_type=task_type,
                task_name=task_name or TASK_NAMES.get(task_type, task_type),
                dataset_type=dataset.hub_id or LOCAL_DATASET_TYPE,
                dataset_name=dataset.name,
                dataset_config=dataset.config,
                dataset_split=split,
                metric_type=_metric_type(name),
                metric_name=metric_name(name),
                metric_value=value,
            )
        )
    return found


def _usage(auto_class: str, repo: str, remote_code: bool, tokenizer_from: str | None) -> list[str]:
    trust = ", trust_remote_code=True" if remote_code else ""
    # AutoTokenizer reads config.json first, and an albert_hf config is remote code: without trust_remote_code it
    # asks "Do you wish to run the custom code?". The tokenizer itself is transformers' AlbertTokenizer, which
    # loads the folder directly, with no remote code and no question.
    tokenizer_class = "AlbertTokenizer" if remote_code else "AutoTokenizer"
    lines = [
        "## Usage",
        "",
        "```python",
        f"from transformers import {auto_class}, {tokenizer_class}",
        "",
        f'tokenizer = {tokenizer_class}.from_pretrained("{tokenizer_from or repo}")',
        f'model = {auto_class}.from_pretrained("{repo}"{trust})',
        "```",
        "",
    ]
    if tokenizer_from:
        lines += [f"No tokenizer files came with the weights: use the source's, `{tokenizer_from}`.", ""]
    if remote_code:
        lines += [
            "The model code ships with the checkpoint (`modeling_albert_hf.py`, hence `trust_remote_code=True`), "
            "so `albert_hf` need not be installed. The tokenizer is transformers' own `AlbertTokenizer` and "
            "needs no remote code; `AutoTokenizer` works too, with `trust_remote_code=True` (it reads the "
            "model's config first, and would otherwise ask whether to run the config's code).",
            "",
        ]
    else:
        lines += ["A transformers ALBERT checkpoint (model_type `albert`): no remote code is needed.", ""]
    return lines


def _architecture(model) -> dict:
    config = model.config
    rows = {
        "architecture": (config.architectures or [type(model).__name__])[0],
        "parameters": f"{sum(p.numel() for p in model.parameters()):,}",
    }
    for key, attribute in [
        ("vocab_size (V)", "vocab_size"),
        ("embedding_size (E)", "embedding_size"),
        ("hidden_size (H)", "hidden_size"),
        ("num_hidden_layers (L)", "num_hidden_layers"),
        ("num_hidden_groups (G)", "num_hidden_groups"),
        ("inner_group_num (K)", "inner_group_num"),
        ("num_attention_heads", "num_attention_heads"),
        ("intermediate_size", "intermediate_size"),
        ("sharing", "sharing"),
        ("hidden_act", "hidden_act"),
        ("max_position_embeddings", "max_position_embeddings"),
    ]:
        if getattr(config, attribute, None) is not None:
            rows[key] = getattr(config, attribute)
    return rows


@dataclass(frozen=True)
class CardContent:
    """What a model card says, built by each job beside itself (pretraining/output/pretraining_card.py,
    tasks/finetuned_card.py, convert/converted_card.py, average/averaging.py) and rendered by `write_model_card`.

    Fields:
        title: the card's heading. summary: the opening paragraph, markdown.
        pipeline_tag: the Hub pipeline tag, e.g. `"fill-mask"`.
        data: the Data section, markdown; None leaves it out.
        training: the Training table's rows; None leaves it out.
        metrics: the Results table's rows; None leaves it out, {} says no evaluation was run.
        tags: tags after "albert" and "albert_hf".
        usage_class: the Auto class of the Usage snippet.
        remote_code: an albert_hf checkpoint, loaded with `trust_remote_code=True`; False: a transformers ALBERT one.
        tokenizer_from: where the Usage snippet loads the tokenizer from, when the folder has none.
        repo: the repo id of the Usage snippet; default PLACEHOLDER.
        license: a Hub license id. base_model: the Hub model it was trained from. datasets: Hub dataset ids.
        language: the language code(s), e.g. `"en"`.
        eval_results: the model-index's entries (`eval_results`); model_name: its name, default the folder's.
        sections: (heading, markdown) sections after the others.
    """

    title: str
    summary: str
    pipeline_tag: str
    data: str | None = None
    training: dict | None = None
    metrics: dict | None = None
    tags: tuple = ()
    usage_class: str = "AutoModel"
    remote_code: bool = True
    tokenizer_from: str | None = None
    repo: str | None = None
    license: str | None = None
    base_model: str | None = None
    datasets: list | None = None
    language: str | list | None = None
    eval_results: list | None = None
    model_name: str | None = None
    sections: tuple = ()


def write_model_card(output_dir, model, card: CardContent) -> Path:
    """Write README.md (the Hub model card) of `card`: metadata (library, pipeline tag, tags, license, base model,
    datasets, model-index) and text: what the model is, how to load it and its tokenizer, its config and size (from
    `model`), data, training, results, then the card's sections.

    Returns:
        `Path`: the card written, output_dir/README.md.
    """
    from huggingface_hub import ModelCard, ModelCardData

    model_name = card.model_name
    if card.eval_results and not model_name:
        model_name = Path(output_dir).absolute().name
    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag=card.pipeline_tag,
        tags=["albert", "albert_hf", *card.tags],
        license=card.license or None,
        base_model=card.base_model or None,
        datasets=list(card.datasets) if card.datasets else None,
        language=card.language or None,
        model_name=model_name if card.eval_results else None,
        eval_results=list(card.eval_results) if card.eval_results else None,
    )
    text = [f"# {card.title}", "", card.summary, ""]
    text += _usage(card.usage_class, card.repo or PLACEHOLDER, card.remote_code, card.tokenizer_from)
    text += ["## Configuration", "", markdown_table(_architecture(model)), ""]
    if card.data is not None:
        text += ["## Data", "", card.data, ""]
    if card.training is not None:
        text += ["## Training", "", markdown_table(card.training), ""]
    if card.metrics is not None:
        text += ["## Results", "", markdown_table(card.metrics) if card.metrics else "No evaluation was run.", ""]
    for heading, body in card.sections:
        text += [f"## {heading}", "", body, ""]
    path = Path(output_dir) / "README.md"
    ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(text)).save(path)
    return path


def framework_versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for package in ("albert_hf", "transformers", "torch", "datasets", "tokenizers", "accelerate", "huggingface_hub"):
        try:
            found.append(f"- {package} {version(package)}")
        except PackageNotFoundError:
            pass
    return "\n".join(found)


CURVES_SECTION = ("Training curves", "![Training curves](training_curves.png)")


# What the fine-tuning tasks' `card_dataset` use


def limits(data_args, wanted) -> str:
    caps = [
        (split, getattr(data_args, f"max_{kind}_samples", None))
        for split, kind in (("train", "train"), ("validation", "eval"), ("test", "predict"))
        if split in wanted
    ]
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
    sources = {
        split: (hub_id, f"`{Path(path).name}`" if path else f"`{data_args.dataset_name}` ({split})")
        for split, path in files.items()
        if path or data_args.dataset_name
    }
    if hub_id:
        return from_sources(data_args.dataset_name, sources, data_args.dataset_config_name, extra)
    read = "; ".join(f"{split}: {how}" for split, (_, how) in sources.items())
    name = "local files" if any(files.values()) else Path(data_args.dataset_name).name
    return CardDataset(name, f"The user's own data, not a Hub dataset; read from: {read}.{extra}")
