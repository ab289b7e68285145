"""A stand-in for the Hub at huggingface_hub's API boundary (`HfApi.create_repo`, `upload_folder`, `create_branch`,
`snapshot_download`, `list_repo_refs`): each repo is a folder whose `main/` holds the current files, each commit is
recorded with the files it wrote and a copy of the tree after it, and a branch is a copy of the tree at the commit it
names. Uploads can be slowed down (`hold`, a function of the commit message that returns when the upload may go on)
or made to fail (`fail`, a function of the commit message)."""

import json
import os
import shutil
import threading
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

from huggingface_hub import CommitInfo, HfApi, RepoUrl
from huggingface_hub.utils import filter_repo_objects

from albert_hf.runtime.output_lock import LOCK_FILE


@dataclass
class Commit:
    repo_id: str
    message: str
    files: list[str]  # as written by the commit, relative to the repo's root
    tree: Path  # the repo's files after it
    lock: str | None  # the output folder's lock as it was during the upload (None: no lock there)


@dataclass
class FakeHub:
    root: Path
    hold: object = None
    fail: object = None  # message -> bool: that commit raises ConnectionError
    commits: list[Commit] = field(default_factory=list)
    branches: dict = field(default_factory=dict)  # (repo, branch) -> its tree
    attempts: list[str] = field(default_factory=list)  # every upload_folder call's message, failed ones included
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self):
        self.root = Path(self.root)

    def main(self, repo_id: str) -> Path:
        return self.root / repo_id / "main"

    def messages(self) -> list[str]:
        return [commit.message for commit in self.commits]

    def logged(self) -> list[dict]:
        """Every commit made under this root, by any process: repo, message, tree and the committing RANK."""
        path = self.root / "commits.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def patched(self) -> ExitStack:
        hub, stack = self, ExitStack()

        def create_repo(api, repo_id, **kwargs):
            hub.main(repo_id).mkdir(parents=True, exist_ok=True)
            return RepoUrl(f"https://huggingface.co/{repo_id}")

        def upload_folder(
            api,
            *,
            repo_id,
            folder_path,
            path_in_repo=None,
            commit_message=None,
            revision=None,
            ignore_patterns=None,
            delete_patterns=None,
            run_as_future=False,
            **kwargs,
        ):
            if run_as_future:  # Trainer's pushes during training: done at once here, handed back as done
                future = Future()
                future.set_result(
                    upload_folder(
                        api,
                        repo_id=repo_id,
                        folder_path=folder_path,
                        path_in_repo=path_in_repo,
                        commit_message=commit_message,
                        revision=revision,
                        ignore_patterns=ignore_patterns,
                        delete_patterns=delete_patterns,
                    )
                )
                return future
            assert revision in (None, "main"), revision  # branches are made by create_branch only
            hub.attempts.append(commit_message)
            if hub.hold is not None:
                hub.hold(commit_message)
            if hub.fail is not None and hub.fail(commit_message):
                raise ConnectionError(f"the fake Hub refused {commit_message!r}")
            folder, prefix = Path(folder_path), path_in_repo.strip("/") if path_in_repo else ""
            names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
            names = list(filter_repo_objects(names, ignore_patterns=ignore_patterns))
            with hub._lock:
                main = hub.main(repo_id)
                assert main.is_dir(), "upload_folder before create_repo"
                target = main / prefix if prefix else main
                if delete_patterns is not None and target.is_dir():
                    assert delete_patterns == "*", delete_patterns
                    shutil.rmtree(target)
                for name in names:
                    (target / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(folder / name, target / name)
                tree = hub.root / repo_id / "commits" / str(len(hub.commits))
                shutil.copytree(main, tree)
                lock = (folder / LOCK_FILE).read_text() if (folder / LOCK_FILE).exists() else None
                hub.commits.append(
                    Commit(repo_id, commit_message, [f"{prefix}/{n}" if prefix else n for n in names], tree, lock)
                )
                with open(hub.root / "commits.jsonl", "a") as log:  # for a test whose runs are other processes
                    log.write(
                        json.dumps(
                            {
                                "repo": repo_id,
                                "message": commit_message,
                                "tree": str(tree),
                                "rank": os.environ.get("RANK", "0"),
                            }
                        )
                        + "\n"
                    )
                oid = f"{len(hub.commits):040x}"
            return CommitInfo(
                commit_url=f"https://huggingface.co/{repo_id}/commit/{oid}",
                commit_message=commit_message,
                commit_description="",
                oid=oid,
            )

        def create_branch(api, repo_id, *, branch, revision=None, exist_ok=False, **kwargs):
            with hub._lock:
                index = int(revision, 16) - 1 if revision else len(hub.commits) - 1
                assert 0 <= index < len(hub.commits), revision
                assert exist_ok or (repo_id, branch) not in hub.branches
                hub.branches[(repo_id, branch)] = hub.commits[index].tree

        def snapshot_download(api, repo_id, *, revision=None, local_dir=None, allow_patterns=None, **kwargs):
            with hub._lock:
                tree = hub.branches.get((repo_id, revision)) if revision else hub.main(repo_id)
                if tree is None or not tree.is_dir():
                    raise FileNotFoundError(f"the fake Hub has no {repo_id}" + (f"@{revision}" if revision else ""))
                names = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
                for name in filter_repo_objects(names, allow_patterns=allow_patterns):
                    (Path(local_dir) / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(tree / name, Path(local_dir) / name)
            return str(local_dir)

        def list_repo_refs(api, repo_id, **kwargs):
            with hub._lock:
                names = sorted(branch for repo, branch in hub.branches if repo == repo_id)
            return SimpleNamespace(branches=[SimpleNamespace(name=name) for name in ["main", *names]], tags=[])

        for name, function in (
            ("create_repo", create_repo),
            ("upload_folder", upload_folder),
            ("create_branch", create_branch),
            ("snapshot_download", snapshot_download),
            ("list_repo_refs", list_repo_refs),
        ):
            stack.enter_context(mock.patch.object(HfApi, name, function))
        return stack
