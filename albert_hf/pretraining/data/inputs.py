"""Arguments -> inputs of the pretraining job: the training and held-out loaders, the tokenizer and a description.

Every source goes through `build_inputs`: a folder written by --preprocess_only (--prepared_data), or a corpus
(plain text, json/parquet/csv, a Hub dataset, the embedded one; read whole or streamed) cut into documents, split
into training and held-out documents, tokenized (a tokenizer trained on the training documents unless one is
named) and built into sentence pairs (`build_data`), then masked and batched by the collator.
"""

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import transformers
from accelerate.utils import gather_object
from torch.utils.data import DataLoader
from transformers import AutoTokenizer

from ...errors import InputError
from ...hub.loading import check_tokenizer, loading
from ...runtime.preemption import at_stage
from ...tokenization import train_tokenizer
from ..arguments import DataArgs, ObjectiveArgs
from . import prepared_data
from .collator import DataCollatorForAlbertPretraining
from .corpus import find_text_files, is_plain_text
from .mixed_pairs import MixedPairs, MixedStream
from .mixture import Mix, MixPlan, normalised, resolve_weights, tokenizer_sample
from .pairs import NoPairsError, build_pretraining_dataset
from .prepared_data import PreparedPairs
from .sources import Source, Sources
from .splits import corpus_splits
from .vocabulary import VocabularyExtension, extend_vocabulary

logger = logging.getLogger(__name__)


def check_train_files(train_files) -> None:
    """Stops with one line, before any work, on a --train_files path that does not exist or holds no text file."""
    for path in train_files or ():
        if not Path(path).exists():
            raise InputError(f"--train_files: {path} does not exist")
    if train_files and is_plain_text(train_files):
        try:
            find_text_files(train_files)
        except InputError as error:
            raise InputError(f"--train_files: {error}") from None


def load_tokenizer(data: DataArgs, model_name_or_path: str | None, train_documents, fingerprint: str | None = None):
    """--tokenizer_name's, the one of --model_name_or_path (a folder or a Hub repo), or for a model built from scratch
    one trained on the training documents."""
    if data.tokenizer_name:
        with loading("--tokenizer_name", data.tokenizer_name):
            tokenizer = AutoTokenizer.from_pretrained(data.tokenizer_name, trust_remote_code=data.trust_remote_code)
        return check_tokenizer(tokenizer, "--tokenizer_name", data.tokenizer_name)
    if model_name_or_path:  # a folder or a Hub repo: the tokenizer its weights were trained with
        folder = Path(model_name_or_path)
        if folder.is_dir() and not any((folder / name).is_file() for name in ("tokenizer.json", "spiece.model")):
            raise InputError(
                f"--model_name_or_path {model_name_or_path} holds no tokenizer (tokenizer.json or "
                "spiece.model): name the one its weights were trained with as --tokenizer_name"
            )
        with loading("--model_name_or_path", model_name_or_path):
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        return check_tokenizer(tokenizer, "--model_name_or_path", model_name_or_path)
    if isinstance(train_documents, datasets.IterableDataset):
        logger.warning(
            "--streaming without --tokenizer_name: the tokenizer is trained first, on a sample of the "
            "whole corpus, which is read once before the first step (pass --tokenizer_name, e.g. the "
            "tokenizer of an earlier run, to stream from the start)"
        )
    return train_tokenizer(
        train_documents,
        vocab_size=data.vocab_size,
        text_column="text",
        sentence_per_line=data.layout == "sentence_per_line",
        input_sentence_size=data.tokenizer_sample_sentences,
        fingerprint=fingerprint,
    )


def build_pairs(
    documents,
    tokenizer,
    data: DataArgs,
    task: str,
    dupe_factor,
    seed,
    one_chunk="random_next",
    where: str | None = None,
):
    """The pairs of the objective. --task none: SOP's pairs without their label, so batches carry none and the
    model's pair head gets no loss (the 2-way metrics then stay out of the logs as well). `where`: the corpus in
    error lines (default: the argument that named it)."""
    try:
        pairs = build_pretraining_dataset(
            documents,
            tokenizer,
            text_column="text",
            sentence_per_line=data.layout == "sentence_per_line",
            num_proc=data.preprocessing_num_workers,
            max_seq_length=data.max_seq_length,
            short_seq_prob=data.short_seq_prob,
            dupe_factor=dupe_factor,
            task="nsp" if task == "nsp" else "sop",
            seed=seed,
            one_chunk=one_chunk,
        )
    except NoPairsError as error:
        which = "its training documents" if one_chunk == "random_next" else "its held-out documents"
        raise InputError(f"{where or corpus_argument(data)} ({which}): {error}") from None
    return pairs.remove_columns("sentence_order_label") if task == "none" else pairs


def corpus_argument(data: DataArgs) -> str:
    """The argument that named the corpus, for error lines."""
    if data.train_files:
        return f"--train_files {' '.join(map(str, data.train_files[:3]))}{' ...' if len(data.train_files) > 3 else ''}"
    return f"--dataset_name {data.dataset_name}" if data.dataset_name else "the embedded corpus"


def build_data(
    data: DataArgs,
    task: str,
    seed: int,
    model_name_or_path: str | None = None,
    process_index: int = 0,
    num_processes: int = 1,
) -> PreparedPairs:
    """Corpus -> training and held-out documents (corpus.py) -> tokenizer -> training and held-out pairs
    (each step a cached `datasets` map). Under --streaming each process gets its own endless stream of pairs, built as
    it is read; the held-out pairs are built up front, from the corpus's first documents."""
    source = data.dataset_name or data.train_files or None
    at_stage("reading the corpus")
    corpus = corpus_splits(
        source,
        layout=data.layout,
        text_column=data.text_column,
        config_name=data.dataset_config_name if data.dataset_name else None,
        streaming=data.streaming,
        held_out_percentage=data.validation_split_percentage,
        seed=seed,
        process_index=process_index,
        num_processes=num_processes,
        name=corpus_argument(data),
        hub_name=bool(data.dataset_name),
    )
    at_stage("loading the tokenizer" if data.tokenizer_name or model_name_or_path else "training the tokenizer")
    tokenizer = load_tokenizer(
        data, model_name_or_path, corpus.tokenizer_documents, fingerprint=corpus.tokenizer_fingerprint
    )
    vocabulary = None
    if data.extend_vocabulary:
        tokenizer, vocabulary = with_domain_pieces(tokenizer, data, corpus_argument(data), corpus, data.layout, seed)
    if corpus.stream_shares:
        logger.info("--streaming: %s; %s", corpus.stream_shares, STREAM_NOTE)
    at_stage("building the training pairs")
    train_pairs = build_pairs(corpus.train, tokenizer, data, task, data.dupe_factor, seed)
    at_stage("building the held-out pairs")
    return PreparedPairs(
        tokenizer, train_pairs, *build_eval_pairs(corpus.held_out, tokenizer, data, task, seed), vocabulary=vocabulary
    )


def build_mixed_data(
    data: DataArgs,
    sources: Sources,
    task: str,
    seed: int,
    model_name_or_path: str | None = None,
    process_index: int = 0,
    num_processes: int = 1,
) -> PreparedPairs:
    """`build_data` for several sources: each source's training and held-out documents (its own held-out share),
    one tokenizer (trained on a sample that follows the weights, unless one is named), each source's pairs, the
    weights resolved against the sizes (`mixture.resolve_weights`), and the held-out pairs of all sources side by
    side with their source's index. Sources prepared by --preprocess_only (`prepared_data`) bring their pairs and
    their tokenizer."""
    names = sources.names
    prepared = {
        source.name: prepared_data.load(source.prepared_data) for source in sources.sources if source.prepared_data
    }
    splits, shaped = source_splits(data, sources, seed, process_index, num_processes)
    tokenizer = next(iter(prepared.values())).tokenizer if prepared else None
    if tokenizer is None:
        at_stage("loading the tokenizer" if data.tokenizer_name or model_name_or_path else "training the tokenizer")
        tokenizer = mixed_tokenizer(data, sources, model_name_or_path, splits, seed)
    vocabulary = None
    if data.extend_vocabulary:
        domain = sources.sources[names.index(data.extend_vocabulary_from or names[0])]
        tokenizer, vocabulary = with_domain_pieces(
            tokenizer, data, f"source {domain.name}", splits[domain.name], domain.layout, seed
        )
    train, held_out, documents, sizes = {}, [], [], {}
    for index, source in enumerate(sources.sources):
        name = source.name
        if name in prepared:
            train[name], eval_pairs, eval_documents = (
                prepared[name].train_pairs,
                prepared[name].eval_pairs,
                prepared[name].eval_documents,
            )
        else:
            at_stage(f"building the pairs of source {name}")
            where = f"source {name} ({source.where()})"
            if name in sources.trained:
                train[name] = build_pairs(
                    splits[name].train, tokenizer, shaped[name], task, data.dupe_factor, seed, where=where
                )
            eval_pairs, eval_documents = build_eval_pairs(
                splits[name].held_out, tokenizer, shaped[name], task, seed, where=where
            )
        if name in sources.trained:
            sizes[name] = len(train[name]) if isinstance(train[name], datasets.Dataset) else None
            if sizes[name] == 0:
                raise InputError(f"source {name} ({source.where()}) gives no training pair")
        if eval_pairs is not None:
            held_out.append(eval_pairs.add_column("source", [index] * len(eval_pairs)))
            documents.append(eval_documents.select_columns(["text"]))
    unit, measured = "pairs", sizes
    if sources.alpha is not None and data.streaming:
        unit, measured = "bytes", {source.name: stream_bytes(source) for source in sources.sources}
    weights = resolve_weights(sources, measured, unit)
    mix = Mix(
        sources.trained, weights, sizes, sources.weighting() + ("" if unit == "pairs" else f" (in {unit})"), names
    )
    eval_pairs = datasets.concatenate_datasets(held_out) if held_out else None
    eval_documents = datasets.concatenate_datasets(documents) if documents else None
    return PreparedPairs(tokenizer, train, eval_pairs, eval_documents, mix, vocabulary)


def source_splits(data: DataArgs, sources: Sources, seed: int, process_index: int, num_processes: int) -> tuple:
    """Each source of text read and split into training and held-out documents (`corpus_splits`): (the splits by
    source name, each source's data arguments with its own layout); the prepared sources are not read."""
    splits, shaped = {}, {}
    for source in sources.sources:
        if source.prepared_data:
            continue
        at_stage(f"reading source {source.name}")
        location = list(source.train_files) if source.train_files else source.dataset_name
        shaped[source.name] = dataclasses.replace(data, layout=source.layout)
        with naming_source(source):
            splits[source.name] = corpus_splits(
                location,
                layout=source.layout,
                text_column=source.text_column,
                config_name=source.dataset_config_name,
                split=source.split,
                streaming=data.streaming,
                held_out_percentage=data.validation_split_percentage,
                seed=seed,
                process_index=process_index,
                num_processes=num_processes,
                name=f"source {source.name}",
                hub_name=bool(source.dataset_name),
            )
            check_documents(splits[source.name].train)
    return splits, shaped


def with_domain_pieces(tokenizer, data: DataArgs, domain: str, corpus, layout: str, seed: int):
    """--extend_vocabulary: (the tokenizer with the pieces learned from the `domain`'s training documents, what was
    added), measured on its held-out documents (data/vocabulary.py)."""
    at_stage("learning the domain's vocabulary")
    return extend_vocabulary(
        tokenizer,
        data.extend_vocabulary,
        domain,
        corpus.tokenizer_documents,
        layout,
        corpus.held_out,
        data.tokenizer_sample_sentences,
        seed,
        corpus.tokenizer_fingerprint,
    )


@contextlib.contextmanager
def naming_source(source: Source):
    """An InputError raised while a source is read names the source."""
    try:
        yield
    except InputError as error:
        if str(error).startswith(f"source {source.name}"):
            raise
        raise InputError(f"source {source.name} ({source.where()}): {error}") from None


def check_documents(documents) -> None:
    """A source that yields no document stops the run (a stream is checked by corpus_splits, for two sentences)."""
    if isinstance(documents, datasets.Dataset) and len(documents) == 0:
        raise InputError("it yields no document")


def stream_bytes(source: Source) -> int | None:
    """A streamed source's size for weights by size: its files' bytes, or a Hub dataset's as its info gives it
    (None when neither is known here)."""
    if source.train_files:
        files = find_text_files(source.train_files) if is_plain_text(source.train_files) else source.train_files
        return sum(Path(file).stat().st_size for file in files)
    try:
        info = datasets.load_dataset_builder(source.dataset_name, source.dataset_config_name).info
        return int(info.splits[source.split].num_bytes) or None
    except Exception:  # offline, no such split, no info: the size is unknown (resolve_weights says so)
        return None


def mixed_tokenizer(data: DataArgs, sources: Sources, model_name_or_path, splits: dict, seed: int):
    """The named tokenizer, or one trained on a sample of sentences that follows the weights (by size: each
    source's sentences, to the power alpha)."""
    if data.tokenizer_name or model_name_or_path:
        return load_tokenizer(data, model_name_or_path, None)
    layouts = {source.name: source.layout for source in sources.sources}
    documents = {name: split.tokenizer_documents for name, split in splits.items() if name in sources.trained}
    weights = (
        normalised({source.name: source.weight for source in sources.sources if source.weight})
        if sources.alpha is None
        else None
    )
    sample, given = tokenizer_sample(
        documents, weights, layouts, data.tokenizer_sample_sentences, seed, alpha=sources.alpha
    )
    logger.info(
        "The tokenizer's sample: %s sentences (%s)",
        f"{len(sample):,}",
        ", ".join(f"{name} {count:,}" for name, count in given.items()),
    )
    return train_tokenizer(sample, vocab_size=data.vocab_size, sentence_per_line=True, input_sentence_size=len(sample))


# A process's training stream never ends: the processes' passes differ in length, and a process whose stream had
# ended would leave the others waiting in their next collective. --max_train_steps ends the run.
STREAM_NOTE = "pass after pass, endlessly, until --max_train_steps"


def build_eval_pairs(
    eval_documents, tokenizer, data: DataArgs, task: str, seed: int, where: str | None = None
) -> tuple:
    """(held-out pairs, held-out documents), or (None, None) without held-out documents."""
    eval_pairs = None
    if eval_documents is not None:
        # Held-out pairs without the one-sentence-chunk quirk (a random-document B labelled 1 even for SOP):
        # the SOP accuracy then measures order prediction only, and chance is 50%.
        eval_pairs = build_pairs(eval_documents, tokenizer, data, task, 1, seed + 1, one_chunk="skip", where=where)
        if hasattr(eval_pairs, "__len__") and data.max_eval_samples:
            eval_pairs = eval_pairs.select(range(min(data.max_eval_samples, len(eval_pairs))))
        elif data.max_eval_samples:
            eval_pairs = eval_pairs.take(data.max_eval_samples)
    return eval_pairs, eval_documents


@dataclass
class Inputs:
    """What `build_inputs` gives the job: the loaders (not yet prepared by accelerate), their tokenizer and training
    collator, the held-out documents (for the fill-mask examples) and notes for the start line."""

    tokenizer: transformers.PreTrainedTokenizerBase
    collate: DataCollatorForAlbertPretraining  # the training collator: `fit` sets its epoch
    train_dataloader: DataLoader
    eval_dataloader: DataLoader | None
    eval_documents: datasets.Dataset | datasets.IterableDataset | None
    notes: list[str] = field(default_factory=list)
    mix: Mix | None = None  # a mixed run's sources (the training pairs: MixedPairs or MixedStream)
    vocabulary: VocabularyExtension | None = None  # --extend_vocabulary's new pieces


def build_inputs(
    data: DataArgs,
    objective: ObjectiveArgs,
    accelerator,
    *,
    seed: int,
    model_name_or_path: str | None,
    adopted: tuple[str, ...],
    batch_sizes: tuple[int, int],
    sources: Sources | None = None,
    accumulation: int = 1,
    max_train_steps: int = 1,
) -> Inputs:
    """The pairs (`read_pairs`), masked and batched (`batch_sizes`: training, evaluation, per process): dynamic
    masks for training, static ones for evaluation. A mixed run's pairs are drawn from its sources on the mix's
    schedule (data/mixture.py), in global batches of the processes' micro-batches x `accumulation`."""
    read = read_pairs(data, objective.task, seed, model_name_or_path, adopted, accelerator, sources)
    tokenizer, train_pairs, eval_pairs = read.tokenizer, read.train_pairs, read.eval_pairs
    if read.mix is not None:
        train_pairs = mixed_pairs(read, seed, batch_sizes[0] * accumulation, accelerator, max_train_steps)
    masking = masking_options(tokenizer, objective, seed, data.max_seq_length, accelerator.device)
    static = "static_shapes" in masking
    # Dynamic masks keyed on (seed, epoch, example) (`set_epoch` in `fit`): the same example gets the same mask
    # whatever the batching, the number of processes or a resume, so runs are exactly reproducible.
    collate = DataCollatorForAlbertPretraining(**masking)
    # Workers mask and batch while the model runs; the masks stay keyed on (seed, epoch, example) in every worker.
    workers = data.dataloader_num_workers
    if workers is None:
        workers = 2 if accelerator.device.type == "cuda" and not data.streaming else 0
    loader_options = dict(num_workers=workers, pin_memory=accelerator.device.type == "cuda")
    # a mixed run's order is the mix's (data/mixture.py: shuffled within each batch)
    train_dataloader = DataLoader(
        train_pairs,
        batch_size=batch_sizes[0],
        collate_fn=collate,
        shuffle=hasattr(train_pairs, "__len__") and read.mix is None,
        **loader_options,
    )
    eval_dataloader = None
    if eval_pairs is not None:
        # Static masking: every evaluation sees the same masks, so the numbers are comparable over time.
        eval_dataloader = DataLoader(
            eval_pairs,
            batch_size=batch_sizes[1],
            collate_fn=DataCollatorForAlbertPretraining(**masking, static_masking=True),
            **loader_options,
        )
    notes = [f"{workers} DataLoader worker{'s' * (workers > 1)}"] if workers else []
    if static:
        notes.append(
            f"static shapes ({data.max_seq_length} tokens, {objective.max_predictions_per_seq} masked positions a row)"
        )
    return Inputs(
        tokenizer, collate, train_dataloader, eval_dataloader, read.eval_documents, notes, read.mix, read.vocabulary
    )


def masking_options(tokenizer, objective: ObjectiveArgs, seed: int, max_seq_length: int, device) -> dict:
    """The collators' masking: the objective's, with the fixed-size masked positions (the model sizes its MLM head
    without reading counts from the device), and on a GPU one batch shape."""
    masking = dict(
        tokenizer=tokenizer,
        mlm_probability=objective.mlm_probability,
        max_ngram=objective.max_ngram,
        max_predictions_per_seq=objective.max_predictions_per_seq,
        seed=seed,
        masked_positions=True,
    )
    # On a GPU every batch has one shape (rows of max_seq_length, max_predictions_per_seq positions), as on the
    # official TPUs: the same kernels every step, nothing sized by a read from the device. CPUs skip the padding.
    if device.type == "cuda":
        masking.update(static_shapes=True, max_length=max_seq_length)
    return masking


def mixed_pairs(read: PreparedPairs, seed: int, process_batch: int, accelerator, max_train_steps: int):
    """The training pairs of a mixed run: `MixedPairs` over the sources' pairs (global batches of `process_batch`
    pairs from each process), or under --streaming this process's `MixedStream` (its own batches of
    `process_batch`). The plan starts at step 0; a resume continues it (`training.loop.resume`)."""
    mix = read.mix
    streams = [read.train_pairs[name] for name in mix.names]
    if any(size is None for size in mix.sizes.values()):
        plan = MixPlan.start(mix.names, mix.sizes, mix.weights, process_batch)
        return MixedStream(streams, plan, seed, accelerator.process_index)
    batch = process_batch * accelerator.num_processes
    plan = MixPlan.start(mix.names, mix.sizes, mix.weights, batch)
    # twice the run's pairs: a rollback (--on_divergence rollback) goes back in steps while the data goes on
    return MixedPairs(streams, plan, seed, 2 * max_train_steps * batch)


def read_pairs(
    data: DataArgs,
    task: str,
    seed: int,
    model_name_or_path: str | None,
    adopted: tuple[str, ...],
    accelerator,
    sources: Sources | None = None,
) -> PreparedPairs:
    """The tokenizer and the pairs: from the --prepared_data folder, or built from the corpus (`build_data`) with
    the main process first (it builds the caches, the others read them)."""
    problem = None
    with accelerator.main_process_first():
        try:
            if data.prepared_data:
                at_stage("reading the prepared pairs")
                read = prepared_data.load(data.prepared_data, sources)
                logger.info(
                    "Training on the pairs prepared in %s (no tokenizing)%s",
                    data.prepared_data,
                    f"; from its manifest: {', '.join(adopted)}" if adopted else "",
                )
            elif sources is not None:
                read = build_mixed_data(
                    data, sources, task, seed, model_name_or_path, accelerator.process_index, accelerator.num_processes
                )
            else:
                read = build_data(
                    data, task, seed, model_name_or_path, accelerator.process_index, accelerator.num_processes
                )
        except InputError as error:
            # Raised below by every process at once: a process stopping alone would leave the others waiting in
            # their next collective, and only the first process prints the line (`runtime.cli.run_entry_point`).
            problem = str(error)
    problems = gather_object([problem]) if accelerator.num_processes > 1 else [problem]
    if any(problems):
        raise InputError(next(found for found in problems if found))
    return read
