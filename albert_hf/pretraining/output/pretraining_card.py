"""The model card of a `run_pretraining.py` model: what the run did (`CardFacts`, filled in from the run's
argument groups by `card_run`) and its held-out results, as the `CardContent` that hub/model_card.py renders."""

from dataclasses import dataclass
from pathlib import Path

from ...hub.model_card import (
    CURVES_SECTION,
    CardContent,
    CardDataset,
    describe_checkpoint,
    eval_results,
    framework_versions,
    hub_dataset_id,
    hub_model_name,
    read_results,
    write_model_card,
)
from ...runtime.throughput import COST_FIELDS, cost_rows
from ..arguments import DataArgs, ModelArgs, ObjectiveArgs, OptimizationArgs, OutputArgs
from ..data.sources import Sources
from ..machine import MachinePlan


@dataclass(frozen=True)
class CardFacts:
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
    sources: tuple[str, ...] = ()  # a mixed run's source names: the training table gives each one's share
    schedule: str = ""  # the learning-rate schedule, and the run a decay branch left (`schedule.SchedulePlan`)


def card_run(
    model: ModelArgs,
    data: DataArgs,
    objective: ObjectiveArgs,
    optimization: OptimizationArgs,
    output: OutputArgs,
    sources: Sources | None,
    plan: MachinePlan,
    schedule: str = "",
) -> CardFacts:
    """What the model card says of this run (its micro-batch: the one the machine took, `plan`'s)."""
    return CardFacts(
        dataset=corpus_card_dataset(data) if sources is None else sources_card_dataset(data, sources),
        task=objective.task,
        max_ngram=objective.max_ngram,
        max_train_steps=optimization.max_train_steps,
        max_seq_length=data.max_seq_length,
        micro_batch=f"{plan.micro_batch} a process x {plan.accumulation} accumulation"
        + (" (found by --auto_find_batch_size)" if optimization.auto_find_batch_size else ""),
        optimizer=optimization.optimizer,
        learning_rate=optimization.learning_rate,
        num_warmup_steps=optimization.num_warmup_steps,
        mixed_precision=optimization.mixed_precision,
        seed=optimization.seed,
        architecture=model.model_config if not model.config_name else "custom",
        base_model=model.model_name_or_path,
        hub_model_id=output.hub_model_id,
        license=output.license,
        output_dir=output.output_dir,
        sources=sources.names if sources is not None else (),
        schedule=schedule,
    )


def sources_card_dataset(data: DataArgs, sources: Sources) -> CardDataset:
    """A mixed run's sources as the Data section describes them (their shares: the training table)."""
    held_out = f"{data.validation_split_percentage:g}% of each source's documents held out for evaluation"
    listed = "; ".join(f"`{source.name}`: {source.where()}" for source in sources.sources)
    return CardDataset(
        f"{len(sources.sources)} sources mixed ({held_out})",
        f"{len(sources.sources)} sources mixed, weights {sources.weighting()} (the training table "
        f"gives each one's realised share): {listed}; {held_out}.",
        splits={"eval_": "held-out"},
    )


def source_rows(results: dict, names) -> dict:
    """The training table's row of each source of a mixed run, from all_results.json's source_<name>_* fields."""
    rows = {}
    for name in names:
        get = lambda field: results.get(f"source_{name}_{field}")  # noqa: E731
        if get("pairs") is None:
            continue
        epochs = f", ×{get('epochs'):.3g} epochs" if get("epochs") is not None else ""
        rows[f"source {name}"] = (
            f"weight {get('weight'):.3g}, share {get('share'):.3g} of the pairs; "
            f"{get('pairs'):,} pairs, {get('tokens'):,.0f} tokens{epochs}"
        )
    return rows


def corpus_card_dataset(data: DataArgs) -> CardDataset:
    """The corpus as the model card's Data section describes it (a Hub dataset, local files or the embedded one)."""
    held_out = f"{data.validation_split_percentage:g}% of the documents held out for evaluation"
    if data.dataset_name:
        hub_id = hub_dataset_id(data.dataset_name)
        config = f", config `{data.dataset_config_name}`" if data.dataset_config_name else ""
        return CardDataset(
            f"{hub_id} ({held_out})",
            f"Hub dataset [{hub_id}](https://huggingface.co/datasets/"
            f"{hub_id}){config}, column `{data.text_column}`; {held_out}.",
            hub_id,
            data.dataset_config_name,
            {"eval_": "train"},
        )
    if data.train_files:
        names = ", ".join(f"`{Path(path).name}`" for path in data.train_files)
        return CardDataset(
            f"local text files ({held_out})",
            f"Local files (not a Hub dataset): {names}, layout `{data.layout}`; {held_out}.",
            splits={"eval_": "held-out"},
        )
    return CardDataset(
        f"embedded corpus ({held_out})",
        f"The embedded corpus (docstrings of the Python standard library; not a Hub dataset); {held_out}.",
        splits={"eval_": "held-out"},
    )


def pretraining_card(
    results: dict,
    facts: CardFacts,
    global_batch: int,
    num_processes: int,
    curves: bool = False,
    where: dict | None = None,
) -> CardContent:
    """The card of a `run_pretraining.py` model: its held-out `results` (all_results.json, the baselines among them,
    `*_baseline`) and, with `curves`, training_curves.png.

    Args:
        results (`dict`): the folder's all_results.json (its model FLOPs and mean MFU go into the training table).
        facts (`CardFacts`): what the run did (data, objective, optimisation, --license, --hub_model_id).
        global_batch (`int`): sequences per optimizer step, over all processes.
        num_processes (`int`): the run's processes.
        curves (`bool`, defaults to `False`): add the Training curves section (training_curves.png, in the folder).
        where (`dict`, *optional*): the hardware and precision of the run (`final_folder.where_trained`).

    """
    dataset = facts.dataset
    pair = {"sop": "sentence-order prediction", "nsp": "next-sentence prediction"}.get(facts.task)
    objective = "masked language modelling with n-gram masking" + (f" and {pair}" if pair else "")
    # the model-index lists the model's results; the baselines stay in the Results table beside them
    found = eval_results(
        results,
        dataset,
        "fill-mask",
        "Masked language modelling",
        with_loss=True,
        keep=lambda name: name.startswith("mlm") and not name.endswith("_baseline"),
    )
    if pair:  # the 2-way head classifies a pair of segments
        found += eval_results(
            results,
            dataset,
            "text-classification",
            pair.capitalize(),
            with_loss=True,
            keep=lambda name: name.startswith(facts.task) and not name.endswith("_baseline"),
        )
    summary = f"An ALBERT model (Lan et al., ICLR 2020) pretrained with albert_hf's `run_pretraining.py`: {objective}."
    if facts.base_model:
        summary += f" Pretraining continued from {describe_checkpoint(facts.base_model)}."
    training = training_table(results, facts, global_batch, num_processes, where)
    return CardContent(
        title=f"ALBERT ({facts.architecture}) pretrained with albert_hf",
        summary=summary,
        pipeline_tag="fill-mask",
        tags=("pretraining", facts.task),
        usage_class="AutoModelForPreTraining",
        data=dataset.description,
        training=training,
        repo=facts.hub_model_id,
        metrics={
            key: value
            for key, value in results.items()  # not where or at what cost it ran, nor the mix
            if not isinstance(value, str) and key not in COST_FIELDS and not key.startswith("source_")
        },
        license=facts.license,
        base_model=hub_model_name(facts.base_model),
        datasets=[dataset.hub_id] if dataset.hub_id else None,
        eval_results=found,
        model_name=(facts.hub_model_id or Path(facts.output_dir).absolute().name).split("/")[-1],
        sections=((CURVES_SECTION,) if curves else ()) + (("Framework versions", framework_versions()),),
    )


def training_table(results: dict, facts: CardFacts, global_batch: int, num_processes: int, where: dict | None) -> dict:
    """The card's Training table: the objective and optimisation, where it ran, what it cost, the sources' shares."""
    return {
        "objective": f"MLM (n-gram, max n={facts.max_ngram}) + {facts.task.upper()}"
        if facts.task != "none"
        else "MLM only",
        "steps": facts.max_train_steps,
        "global batch": global_batch,
        "micro-batch": facts.micro_batch,
        "sequence length": facts.max_seq_length,
        "optimizer": facts.optimizer.upper(),
        "peak learning rate": facts.learning_rate,
        "warmup steps": facts.num_warmup_steps,
        **({"learning-rate schedule": facts.schedule} if facts.schedule else {}),
        "processes": num_processes,
        "mixed precision": (where or {}).get("precision", facts.mixed_precision),
        "seed": facts.seed,
        **({"hardware": where["hardware"]} if where else {}),
        **cost_rows(results),
        **source_rows(results, facts.sources),
    }


def write_pretraining_card(
    output_dir,
    model,
    facts: CardFacts,
    global_batch: int,
    num_processes: int,
    curves: bool = False,
    where: dict | None = None,
) -> Path:
    """The card of a `run_pretraining.py` model into output_dir/README.md, with its all_results.json."""
    return write_model_card(
        output_dir, model, pretraining_card(read_results(output_dir), facts, global_batch, num_processes, curves, where)
    )
