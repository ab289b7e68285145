"""The model card of a `python -m albert_hf.convert` output, as the `CardContent` that hub/model_card.py renders:
the same weights under a translated config, a local source card's metadata carried over."""

from pathlib import Path

from ..hub.model_card import CardContent, folder_name, hub_model_name, write_model_card

# architecture suffix -> (pipeline tag, Auto class)
_HEADS = {
    "ForPreTraining": ("fill-mask", "AutoModelForPreTraining"),
    "ForMaskedLM": ("fill-mask", "AutoModelForMaskedLM"),
    "ForSequenceClassification": ("text-classification", "AutoModelForSequenceClassification"),
    "ForMultipleChoice": ("multiple-choice", "AutoModelForMultipleChoice"),
    "ForQuestionAnswering": ("question-answering", "AutoModelForQuestionAnswering"),
    "ForQuestionAnsweringWithAnswerability": ("question-answering", "AutoModelForQuestionAnswering"),
    "ForTokenClassification": ("token-classification", "AutoModelForTokenClassification"),
}


def carried_metadata(source: Path) -> dict:
    """The metadata of a local source's card carried over to the converted one (the weights being the same)."""
    from huggingface_hub import ModelCard

    if not (source / "README.md").is_file():
        return {}
    data = ModelCard.load(source / "README.md", ignore_metadata_errors=True).data
    keys = ("license", "datasets", "language", "base_model", "eval_results")
    return {key: getattr(data, key, None) for key in keys if getattr(data, key, None)}


def write_converted_card(
    out_dir, *, source: str, target: str, model, tokenizer_copied: bool, license: str | None = None
) -> Path:
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
    architecture = (model.config.architectures or [type(model).__name__])[0]
    head = next((suffix for suffix in sorted(_HEADS, key=len, reverse=True) if architecture.endswith(suffix)), None)
    pipeline_tag, auto_class = _HEADS.get(head, ("feature-extraction", "AutoModel"))
    carried = carried_metadata(Path(source))
    found = carried.get("eval_results") or []
    formats = {
        "albert_hf": "albert_hf (model_type `albert_hf`, code shipped with the checkpoint)",
        "transformers": "transformers' ALBERT (model_type `albert`)",
    }
    summary = (
        f"`{folder_name(source) if Path(source).exists() else source}` converted to {formats[target]} with "
        "`python -m albert_hf.convert`: the same weights under a translated config."
    )
    if carried:
        summary += (
            " The source's card metadata (license, datasets, base model, evaluation results) is carried "
            "over; see the source's card for how it was trained."
        )
    metrics = (
        {
            f"{r.dataset_name} {r.dataset_split or ''} {r.metric_name or r.metric_type}".replace(
                "  ", " "
            ): r.metric_value
            for r in found
        }
        if found
        else None
    )
    return write_model_card(
        out_dir,
        model,
        CardContent(
            title=f"{architecture} (converted by albert_hf)",
            summary=summary,
            pipeline_tag=pipeline_tag,
            tags=(pipeline_tag, "converted"),
            usage_class=auto_class,
            remote_code=target == "albert_hf",
            metrics=metrics,
            tokenizer_from=None
            if tokenizer_copied
            else hub_model_name(source) or f"<tokenizer of {folder_name(source)}>",
            license=license or carried.get("license"),
            base_model=carried.get("base_model") or hub_model_name(source),
            datasets=carried.get("datasets"),
            language=carried.get("language"),
            eval_results=found or None,
            model_name=Path(out_dir).absolute().name,
        ),
    )
