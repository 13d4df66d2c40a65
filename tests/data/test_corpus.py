"""Corpora: files, directories, globs, dataset files, the named download; documents, fingerprints, bad input."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

import tinylm.data.corpus as corpus_mod
from tinylm.data.corpus import EOT, open_corpus


def _no_network(monkeypatch):
    """Route every HTTP(S) request to a closed local port, so a download fails at once."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


def test_single_file_is_one_verbatim_document(small_data, tmp_path):
    """Prevents a plain text file from being altered (stripped, split) on its way to the tokenizer."""
    text = (small_data / "tinyshakespeare_100k.txt").read_text(encoding="utf-8")
    (tmp_path / "s.txt").write_text(text, encoding="utf-8")
    assert list(open_corpus(str(tmp_path / "s.txt"), cache_dir=tmp_path)) == [text]


def test_endoftext_file_splits_into_documents(small_data, tmp_path):
    """Prevents TinyStories-style files from becoming one document with literal '<|endoftext|>' text in it."""
    raw = (small_data / "stories.txt").read_text(encoding="utf-8")
    expected = [d.strip() for d in raw.split(EOT) if d.strip()]
    docs = list(open_corpus(str(small_data / "stories.txt"), cache_dir=tmp_path))
    assert len(expected) >= 2 and docs == expected
    assert docs[0].startswith("Once upon a time") and all(EOT not in d for d in docs)


def test_separator_across_read_boundary(small_data, tmp_path, monkeypatch):
    """Prevents a separator that straddles two streamed reads from being missed."""
    path = small_data / "stories.txt"
    whole = list(open_corpus(str(path), cache_dir=tmp_path))
    monkeypatch.setattr(corpus_mod, "_READ_BYTES", 7)  # every separator now spans reads
    assert list(open_corpus(str(path), cache_dir=tmp_path)) == whole


def test_directory_and_glob_are_sorted_files(tmp_path):
    """Prevents directory corpora from depending on listing order or swallowing hidden files."""
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "b.txt").write_text("bee")
    (d / "a.txt").write_text("ay")
    (d / "sub" / "c.txt").write_text("sea")
    (d / ".hidden").write_text("secret")
    assert list(open_corpus(str(d), cache_dir=tmp_path)) == ["ay", "bee", "sea"]
    assert list(open_corpus(str(d / "*.txt"), cache_dir=tmp_path)) == ["ay", "bee"]


def test_directory_corpus_skips_git_and_other_hidden_folders(tmp_path):
    """Catches `--data.corpus .` in a repository training on .git's files (objects, HEAD, config: compressed
    binary and plumbing, the same text in every commit) or a .venv's: folders whose name starts with "." are not
    entered, at any depth; a file named with a dot inside a visible folder is no reason to skip the folder."""
    d = tmp_path / "repo"
    for folder in (".git/objects/ab", "sub/.venv/lib", "sub/v.1"):
        (d / folder).mkdir(parents=True)
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (d / ".git" / "objects" / "ab" / "cdef").write_text("blob of an old a.txt")
    (d / "sub" / ".venv" / "lib" / "site.py").write_text("import os")
    (d / "a.txt").write_text("ay")
    (d / "sub" / "v.1" / "b.txt").write_text("bee")
    assert list(open_corpus(str(d), cache_dir=tmp_path)) == ["ay", "bee"]


def test_non_utf8_replaced_with_one_warning(tmp_path):
    """Prevents a crash (or silent corruption without notice) on files that are not valid UTF-8."""
    d = tmp_path / "bad"
    d.mkdir()
    (d / "1.txt").write_bytes(b"caf\xe9 ok")
    (d / "2.txt").write_bytes(b"\xff\xfe more")
    corpus = open_corpus(str(d), cache_dir=tmp_path)
    with pytest.warns(UserWarning, match="not valid UTF-8") as record:
        docs = list(corpus)
    assert docs == ["caf\ufffd ok", "\ufffd\ufffd more"]
    assert len([w for w in record if "UTF-8" in str(w.message)]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(corpus) == docs  # a second pass (packing after training) does not warn again


def test_nul_bytes_below_the_binary_share_are_warned_of_once(tmp_path):
    """Catches NUL bytes (a hole a crash left in a log: 4 KB of them in 100 KB of text) trained on as a character
    without a word: only undecodable bytes were warned of, and NULs counted only toward the "binary" refusal."""
    text = "To be, or not to be, that is the question.\n" * 1200
    (tmp_path / "log.txt").write_bytes(text.encode() + b"\0" * 4096 + text.encode())
    corpus = open_corpus(str(tmp_path / "log.txt"), cache_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"log.txt holds 4096 NUL byte\(s\), .*remove them") as record:
        assert list(corpus) == [text + "\0" * 4096 + text]  # kept as they are (the warning says so)
    assert len([w for w in record if "NUL" in str(w.message)]) == 1 and not [w for w in record if "UTF" in
                                                                              str(w.message)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(corpus)  # a second pass does not warn again


def test_missing_paths_name_the_fix(tmp_path):
    """Prevents a missing corpus from failing later with an unrelated error."""
    with pytest.raises(FileNotFoundError, match=r"nope\.txt.*--data\.corpus PATH"):
        open_corpus(str(tmp_path / "nope.txt"), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"matches no files.*--data\.corpus PATH"):
        open_corpus(str(tmp_path / "*.md"), cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no files"):
        open_corpus(str(tmp_path / "empty"), cache_dir=tmp_path)


def test_fingerprint_follows_content(tmp_path):
    """Prevents a stale dataset being reused after the corpus text changed (or rebuilt when it did not)."""
    path = tmp_path / "c.txt"
    path.write_text("hello world")
    fp1 = open_corpus(str(path), cache_dir=tmp_path).fingerprint
    assert open_corpus(str(path), cache_dir=tmp_path).fingerprint == fp1
    path.write_text("hello world!")
    assert open_corpus(str(path), cache_dir=tmp_path).fingerprint != fp1


def test_named_corpus_uses_verified_cache_offline(shared_data, tmp_path, monkeypatch):
    """Prevents re-downloading (or needing the network for) a cached tinyshakespeare with the right sha256."""
    _no_network(monkeypatch)
    (tmp_path / "corpora").mkdir()
    shutil.copy(shared_data / "tinyshakespeare.txt", tmp_path / "corpora" / "tinyshakespeare.txt")
    docs = list(open_corpus("tinyshakespeare", cache_dir=tmp_path))
    assert len(docs) == 1 and len(docs[0]) == 1_115_394


def test_named_corpus_without_network_names_the_fix(tmp_path, monkeypatch):
    """Prevents a corrupt cached copy being used, or a bare network error, when the download is impossible."""
    _no_network(monkeypatch)
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "tinyshakespeare.txt").write_text("truncated")
    with pytest.raises(RuntimeError, match=r"could not download corpus 'tinyshakespeare'.*--data\.corpus PATH"):
        open_corpus("tinyshakespeare", cache_dir=tmp_path)



def test_ranks_that_download_a_named_corpus_at_once_each_get_it(tmp_path, monkeypatch):
    """Catches processes started at once (torchrun, SLURM: every rank opens the corpus) downloading a named corpus
    into one temp file: each truncated and wrote the other's copy, and the one that renamed it into place second
    found no file (a FileNotFoundError traceback), or a copy whose sha256 was wrong. A server on this machine sends
    half of the text to each of two downloads before either gets the rest."""
    import hashlib
    import threading
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tinylm.data.named import NAMED, download_named

    text = b"the cat sat on the mat.\n" * 100_000  # 2.4 MB: several reads of the download
    both = threading.Barrier(2)

    class Halves(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text[: len(text) // 2])
            self.wfile.flush()
            with contextlib.suppress(threading.BrokenBarrierError):  # (one download at a time: no second comes)
                both.wait(timeout=1)
            self.wfile.write(text[len(text) // 2:])

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Halves)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # straight to it, whatever proxy urlopen's opener took from the environment when it was first used
    monkeypatch.setattr(urllib.request, "_opener", urllib.request.build_opener(urllib.request.ProxyHandler({})))
    monkeypatch.setitem(NAMED, "tinyshakespeare", {"url": f"http://127.0.0.1:{server.server_port}/input.txt",
                                                   "sha256": hashlib.sha256(text).hexdigest(), "file": "t.txt"})
    results: list = []

    def rank() -> None:
        try:
            results.append(download_named("tinyshakespeare", tmp_path))
        except Exception as e:  # noqa: BLE001 (the test names it)
            results.append(e)

    ranks = [threading.Thread(target=rank) for _ in range(2)]
    try:
        for t in ranks:
            t.start()
        for t in ranks:
            t.join(timeout=60)
    finally:
        server.shutdown()
    assert results == [tmp_path / "corpora" / "t.txt"] * 2, results
    assert (tmp_path / "corpora" / "t.txt").read_bytes() == text
    assert sorted(p.name for p in (tmp_path / "corpora").iterdir() if not p.name.endswith(".lock")) == ["t.txt"]

def test_jsonl_file_rows_are_documents(tmp_path):
    """Prevents local dataset files from being read as raw text (JSON syntax in the training data)."""
    rows = [{"text": "first story", "id": 1}, {"text": "second story", "id": 2}, {"text": "", "id": 3}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = open_corpus(str(tmp_path / "d.jsonl"), cache_dir=tmp_path)
    assert list(corpus) == ["first story", "second story"] and not corpus.has_validation
    with pytest.raises(ValueError, match=r"no column 'body'.*--data\.text_column"):
        list(open_corpus(str(tmp_path / "d.jsonl"), cache_dir=tmp_path, text_column="body"))
    (tmp_path / "n.jsonl").write_text('{"text": 5, "body": "a"}\n{"text": 7, "body": "b"}\n')  # numbers, not text
    for streaming in (False, True):
        with pytest.raises(ValueError, match=r"column 'text' holds int values \(e\.g\. '5'\), not text; pass "
                                             r"--data\.text_column"):
            list(open_corpus(str(tmp_path / "n.jsonl"), cache_dir=tmp_path / str(streaming), streaming=streaming,
                             **({"max_documents": 2} if streaming else {})))


def test_hf_builder_with_validation_split(tmp_path):
    """Prevents a dataset's own validation split from being ignored (or mixed into training)."""
    import datasets

    datasets.Dataset.from_dict({"story": ["a tale", "b tale"]}).to_parquet(str(tmp_path / "train.parquet"))
    datasets.Dataset.from_dict({"story": ["held out"]}).to_parquet(str(tmp_path / "val.parquet"))
    files = {"train": str(tmp_path / "train.parquet"), "validation": str(tmp_path / "val.parquet")}
    corpus = open_corpus("hf:parquet", cache_dir=tmp_path, data_files=files, text_column="story")
    assert corpus.has_validation
    assert list(corpus.documents("train")) == ["a tale", "b tale"]
    assert list(corpus.documents("validation")) == ["held out"]
    datasets.Dataset.from_dict({"story": ["c tale"]}).to_parquet(str(tmp_path / "other.parquet"))
    other = open_corpus("hf:parquet", cache_dir=tmp_path, text_column="story",
                        data_files={**files, "train": str(tmp_path / "other.parquet")})
    assert other.fingerprint != corpus.fingerprint


def test_symlinks_and_loops_read_each_file_once(tmp_path):
    """Prevents a `**` glob through a symlink loop (dir/loop -> dir), or a link beside its target, from reading
    the same file many times: duplicated text that lands in both train and val."""
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("ay")
    (d / "sub" / "b.txt").write_text("bee")
    (d / "sub" / "loop").symlink_to(d, target_is_directory=True)
    (d / "z.txt").symlink_to(d / "a.txt")
    assert list(open_corpus(str(d / "**" / "*.txt"), cache_dir=tmp_path)) == ["ay", "bee"]
    assert list(open_corpus(str(d), cache_dir=tmp_path)) == ["ay", "bee"]


def test_binary_files_are_refused_by_name(tmp_path):
    """Prevents an executable or image in a corpus folder from being trained on as text with a single UTF-8
    warning; a few stray bytes in a real text file still only warn; a gzip'd corpus called "binary" (with advice to
    re-encode it as UTF-8) rather than compressed."""
    import gzip
    import random

    d = tmp_path / "mixed"
    d.mkdir()
    (d / "notes.txt").write_bytes(b"caf\xe9 au lait, " * 100)  # Latin-1: 1 bad byte in 15, still text
    (d / "z.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + random.Random(0).randbytes(4000))
    with pytest.warns(UserWarning, match="not valid UTF-8"), \
            pytest.raises(ValueError, match=r"z\.png looks binary.*remove it from the corpus"):
        list(open_corpus(str(d), cache_dir=tmp_path))
    (d / "z.png").write_bytes(bytes(100_000))  # a file of NULs (a sparse or preallocated file) is valid UTF-8
    with pytest.raises(ValueError, match=r"z\.png looks binary"):
        list(open_corpus(str(d / "z.png"), cache_dir=tmp_path))
    # a corpus downloaded compressed: named as such, with the command that makes it text
    (d / "c.txt.gz").write_bytes(gzip.compress(random.Random(0).randbytes(4000)))
    with pytest.raises(ValueError, match=r"c\.txt\.gz is gzip-compressed, not text.*gzip -dk .*c\.txt\.gz"):
        list(open_corpus(str(d / "c.txt.gz"), cache_dir=tmp_path))


def test_fifo_and_devices_are_refused_at_once(tmp_path):
    """Prevents a FIFO from being reported as "not found" and /dev/zero from being read forever."""
    import os

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match=r"'.*pipe' is a FIFO \(named pipe\), not a regular file.*--data\.corpus"):
        open_corpus(str(tmp_path / "pipe"), cache_dir=tmp_path)
    with pytest.raises(ValueError, match=r"'/dev/zero' is a character device"):
        open_corpus("/dev/zero", cache_dir=tmp_path)


def test_absurdly_long_document_is_refused(tmp_path, monkeypatch):
    """Prevents one giant document (a multi-GB file with no separators) from being built up in memory until the
    machine runs out of it; separated documents of the same total size are fine."""
    monkeypatch.setattr(corpus_mod, "MAX_DOCUMENT_CHARS", 1000)
    monkeypatch.setattr(corpus_mod, "_READ_BYTES", 300)
    (tmp_path / "ok.txt").write_text(f"{'a' * 900}{EOT}{'b' * 900}")
    assert [len(d) for d in open_corpus(str(tmp_path / "ok.txt"), cache_dir=tmp_path)] == [900, 900]
    (tmp_path / "huge.txt").write_text("a" * 1800)
    with pytest.raises(ValueError, match=rf"huge\.txt holds a document of more than 1,000 characters.*{EOT}"):
        list(open_corpus(str(tmp_path / "huge.txt"), cache_dir=tmp_path))


def test_malformed_dataset_file_is_named(tmp_path):
    """Prevents a broken .jsonl from failing with datasets' bare "An error occurred while generating the dataset"
    (no file, no cause)."""
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": oops\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl.*as a json dataset.*fix the file"):
        list(open_corpus(str(tmp_path / "broken.jsonl"), cache_dir=tmp_path))
    # an empty one is an empty corpus, as an empty .txt is (it was "--data.data_files ... matches no file": an
    # option the user never passed, for a file that is there)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    for name, streaming in [("empty", False), ("blank", False), ("empty", True)]:  # (blank streamed: no rows)
        with pytest.raises(ValueError,
                           match=rf"corpus '.*{name}\.jsonl' is empty \(no text in it\); pass --data.corpus"):
            list(open_corpus(str(tmp_path / f"{name}.jsonl"), cache_dir=tmp_path, streaming=streaming,
                             max_documents=10))


def test_empty_spec_is_refused_and_a_folder_corpus_skips_the_cache(tmp_path, monkeypatch):
    """Catches `--data.corpus ""` (an unset shell variable) reading the whole current folder, and a corpus of `.`
    reading tinylm's own cache (its .bin files) or runs (checkpoints, samples) into the next run's training text."""
    for spec in ("", "  "):
        with pytest.raises(ValueError, match=r"--data.corpus is empty .*unset shell variable"):
            open_corpus(spec, cache_dir=tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "data_cache" / "datasets").mkdir(parents=True)
    (tmp_path / "data_cache" / "datasets" / "train.bin").write_bytes(b"\0\1" * 100)
    (tmp_path / "data_cache" / "hf-local" / "k").mkdir(parents=True)
    (tmp_path / "data_cache" / "hf-local" / "k" / "rows.arrow").write_bytes(b"ARROW1")
    assert list(open_corpus(".", cache_dir="data_cache")) == ["my notes"]
    assert list(open_corpus("**/*", cache_dir="data_cache")) == ["my notes"]
    # a run folder of the default runs/ root beside the texts: its checkpoints, logs and samples are not text of
    # the corpus (the second `tinylm fit --data.corpus .` refused the folder as "mixes files of different kinds
    # (.ckpt, .csv, .txt, .yaml)"; `'**/*.txt'` trained on the first run's samples.txt)
    run = tmp_path / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"PK\3\4" + bytes(100))
    (run / "hf" / "tokenizer").mkdir(parents=True)
    (run / "hf" / "tokenizer" / "vocab.txt").write_text("a b c")
    for name in (".lock", "config.yaml", "samples.txt"):
        (run / name).write_text("pid 1" if name == ".lock" else "text")
    wandb = run / "wandb" / "offline-run-1" / "files"  # 4 folders down: a glob read W&B's logs and requirements.txt
    wandb.mkdir(parents=True)
    (wandb / "requirements.txt").write_text("torch==2.13")
    assert list(open_corpus(".", cache_dir="data_cache")) == ["my notes"]
    assert list(open_corpus("**/*.txt", cache_dir="data_cache")) == ["my notes"]


def test_a_folder_corpus_skips_the_caches_fingerprints_file(tmp_path, monkeypatch):
    """Catches `--data.corpus .` (or `'**/*'`) reading the cache's fingerprints.json, which the run that hashed the
    corpus writes there: the next `tinylm prepare --data.corpus .` refused the folder as "mixes files of different
    kinds (.json, .txt)" (and a folder of .json files would have trained on it)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "data_cache").mkdir()
    (tmp_path / "data_cache" / "fingerprints.json").write_text("{}\n")
    (tmp_path / "data_cache" / "fingerprints.json.tmp-host-1").write_text("{}\n")  # (one being written)
    assert list(open_corpus(".", cache_dir="data_cache")) == ["my notes"]
    assert list(open_corpus("**/*", cache_dir="data_cache")) == ["my notes"]


def test_a_folder_that_cannot_be_read_is_an_error_not_a_gap(tmp_path):
    """Catches an unreadable subfolder being left out of a directory corpus without a word (2 of 3 documents
    trained on, exit 0)."""
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "docs" / "a.txt").write_text("ay")
    (tmp_path / "docs" / "sub" / "b.txt").write_text("bee")
    (tmp_path / "docs" / "sub").chmod(0)
    cmd = [sys.executable, "-c", ("import sys; from tinylm.data.corpus import open_corpus; "
                                  "print(list(open_corpus(sys.argv[1], cache_dir=sys.argv[2])))"),
           str(tmp_path / "docs"), str(tmp_path)]
    if os.geteuid() == 0:  # root reads anything: drop the capabilities that let it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv to drop the right to read any folder")
        caps = "-dac_override,-dac_read_search"
        cmd = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", "--", *cmd]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    finally:
        (tmp_path / "docs" / "sub").chmod(0o755)
    assert out.returncode != 0, out.stdout
    assert "PermissionError" in out.stderr and "sub" in out.stderr and "make it readable" in out.stderr


def test_folders_and_globs_of_dataset_files_are_datasets(tmp_path):
    """Catches a folder or glob of .jsonl shards being trained on as raw JSON text ('{"text": ...}' in train.bin),
    and a folder mixing dataset and text files being read either way without a word."""
    d = tmp_path / "shards"
    d.mkdir()
    for i in range(2):
        (d / f"part{i}.jsonl").write_text("".join(json.dumps({"text": f"doc {i}.{j}"}) + "\n" for j in range(2)))
    for spec in (str(d), str(d / "*.jsonl")):
        corpus = open_corpus(spec, cache_dir=tmp_path / "cache")
        assert list(corpus) == ["doc 0.0", "doc 0.1", "doc 1.0", "doc 1.1"]
    (d / "README.txt").write_text("about these shards")
    with pytest.raises(ValueError, match=r"mixes files of different kinds \(\.jsonl, \.txt\).*'DIR/\*\*/\*\.txt'"):
        open_corpus(str(d), cache_dir=tmp_path / "cache")


def test_dataset_file_fingerprint_follows_content_not_mtime(tmp_path):
    """Catches a local .jsonl edited with its modification time kept (cp -p, rsync -a, tar x) reusing the stale
    dataset: `datasets` fingerprints local files by path and mtime."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "hello world"}) + "\n")
    before = open_corpus(str(path), cache_dir=tmp_path / "c1").fingerprint
    stamp = path.stat()
    path.write_text(json.dumps({"text": "hi there friend"}) + "\n")
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after = open_corpus(str(path), cache_dir=tmp_path / "c2")
    assert after.fingerprint != before and list(after) == ["hi there friend"]
    moved = tmp_path / "elsewhere" / "renamed.jsonl"  # same text, another path and mtime: the same corpus
    moved.parent.mkdir()
    shutil.copy(path, moved)
    assert open_corpus(str(moved), cache_dir=tmp_path / "c2").fingerprint == after.fingerprint
    with pytest.raises(FileNotFoundError, match=r"--data.data_files .*matches no file"):
        list(open_corpus("hf:json", cache_dir=tmp_path / "c3", data_files=str(tmp_path / "none" / "*.jsonl")))
    # a local folder named as the dataset (hf:DIR: its train.jsonl and validation.jsonl) too: it was keyed by mtimes
    folder = tmp_path / "dir"
    folder.mkdir()
    for split in ("train", "validation"):
        (folder / f"{split}.jsonl").write_text(json.dumps({"text": f"{split} rows"}) + "\n")
    streamed = {"streaming": True, "max_documents": 1}  # (streamed too)
    before = open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c4").fingerprint
    before_streamed = open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c4", **streamed).fingerprint
    stamp = (folder / "train.jsonl").stat()
    (folder / "train.jsonl").write_text(json.dumps({"text": "train rows!"}) + "\n")
    os.utime(folder / "train.jsonl", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    after = open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c4")
    assert after.fingerprint != before and list(after) == ["train rows!"]
    assert open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c4", **streamed).fingerprint != before_streamed
    assert list(after.documents("validation")) == ["validation rows"]


@pytest.mark.parametrize("streaming", [False, True])
def test_a_dataset_folders_data_files_are_keyed_by_their_contents(tmp_path, streaming):
    """Catches `hf:DIR --data.data_files train.jsonl` (a path in the folder, as `datasets` reads it) looked for in the
    current folder, found nowhere and so keyed by `datasets`' fingerprint of paths and mtimes: the file edited with
    its mtime kept (cp -p, rsync -a) gave the old key, and `tinylm prepare` reused the dataset of the old rows; and
    `{train: train.jsonl, validation: train.jsonl}` in the folder accepted (val/loss scored training text)."""
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(4)))
    options = {"data_files": "train.jsonl", "streaming": streaming, "max_documents": 2 if streaming else None}
    before = open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c", **options)
    assert before.fingerprint and list(before) == (["row 1", "row 2"] if streaming else ["row 0", "row 1", "row 2",
                                                                                         "row 3"])
    was = (folder / "train.jsonl").stat()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": f"new {i}"}) + "\n" for i in range(4)))
    os.utime(folder / "train.jsonl", ns=(was.st_atime_ns, was.st_mtime_ns))
    after = open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c", **options)
    assert after.fingerprint != before.fingerprint and list(after)[-1] == ("new 2" if streaming else "new 3")
    # and one file given to both splits is refused there as for hf:json (validation scored training text)
    with pytest.raises(ValueError, match=rf"gives the 'train' and 'validation' splits the same file {folder}"):
        open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c", **{**options, "data_files": {
            "train": "train.jsonl", "validation": "train.jsonl"}})


def test_a_folder_datasets_saved_is_read_as_a_dataset(tmp_path):
    """Catches a `save_to_disk` folder named as a corpus read as text (its Arrow bytes, or its JSON files as rows
    after the hint to glob them), and `hf:FOLDER` of a single saved Dataset ending in `datasets`' traceback ("use
    load_from_disk")."""
    import datasets

    rows = datasets.Dataset.from_dict({"text": [f"row {i}" for i in range(6)]})
    rows.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": rows, "validation": rows.select(range(2))}).save_to_disk(str(tmp_path / "dict"))
    for name in ("one", "dict"):
        with pytest.raises(ValueError, match=rf"is a folder `datasets` saved \(save_to_disk\); pass --data.corpus "
                                             rf"hf:{tmp_path / name} to read its rows"):
            open_corpus(str(tmp_path / name), cache_dir=tmp_path / "cache")
    one = open_corpus(f"hf:{tmp_path / 'one'}", cache_dir=tmp_path / "cache")
    assert list(one) == [f"row {i}" for i in range(6)] and not one.has_validation
    both = open_corpus(f"hf:{tmp_path / 'dict'}", cache_dir=tmp_path / "cache")
    assert list(both.documents("validation")) == ["row 0", "row 1"]


def test_a_dataset_file_written_to_while_it_is_loaded_is_refused(tmp_path, monkeypatch):
    """Catches rows cached under the contents key of a .jsonl appended to while `datasets` read it (the change is
    real, only its timing is arranged: after the file was hashed): the key lied about the rows, and so would the
    packed dataset's."""
    import datasets

    path, cache = tmp_path / "rows.jsonl", tmp_path / "cache"
    path.write_text('{"text": "one"}\n{"text": "two"}\n')
    load = datasets.load_dataset

    def appended_first(*args, **kwargs):
        with open(path, "a") as f:
            f.write('{"text": "three"}\n')
        return load(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", appended_first)
    with pytest.raises(corpus_mod.CorpusChanged, match=rf"^corpus file {path} changed while it was read"):
        list(open_corpus(str(path), cache_dir=cache))
    assert list((cache / "hf-local").iterdir()) == []  # no rows cached under the stale key
    monkeypatch.setattr(datasets, "load_dataset", load)
    assert list(open_corpus(str(path), cache_dir=cache)) == ["one", "two", "three"]


def test_the_same_text_listed_twice_is_refused(tmp_path, capsys, monkeypatch):
    """Catches a corpus list that reads one file twice (`a.txt` and `./a.txt`, a link and its target, a folder and
    a file in it): its text counted twice, in both splits and with twice its share of the windows, silently."""
    from helpers import _one_line_error

    from tinylm.data.mixture import open_corpora

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("alpha beta", encoding="utf-8")
    (tmp_path / "d" / "b.txt").write_text("gamma delta", encoding="utf-8")
    (tmp_path / "link.txt").symlink_to(tmp_path / "d" / "a.txt")
    for specs in (["d/a.txt", "./d/a.txt"], ["d", "d/b.txt"], ["link.txt", "d/a.txt"]):
        with pytest.raises(ValueError, match="which both read the file .*: its text would count twice"):
            open_corpora(specs, cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"lists 'd/a.txt' twice \(the file .*a\.txt\): its text would count"):
        open_corpora(["d/a.txt", "d/a.txt"], cache_dir=tmp_path / "cache")  # (it read "'d/a.txt' twice the file")
    _one_line_error(capsys, ["prepare", "--data.corpus", "[d, d/b.txt]", "--data.cache_dir", str(tmp_path / "cache")],
                    "data.corpus lists 'd' and 'd/b.txt'", "list each file once")
    assert len(open_corpora(["d/a.txt", "d/b.txt"], cache_dir=tmp_path / "cache")) == 2  # distinct files: fine
    # the same text under another file: a hard link (the same inode, another real path) or a copy
    os.link(tmp_path / "d" / "a.txt", tmp_path / "hard.txt")
    shutil.copy(tmp_path / "d" / "a.txt", tmp_path / "copy.txt")
    for other in ("hard.txt", "copy.txt"):
        with pytest.raises(ValueError, match=rf"lists 'd/a.txt' and '{other}', which hold the same text"):
            open_corpora(["d/a.txt", other], cache_dir=tmp_path / "cache")


def test_a_dataset_folder_listed_twice_is_refused(tmp_path, monkeypatch):
    """Catches `[hf:ds, hf:./ds]` or `[hf:ds, ds/train.jsonl]` (an `hf:DIR` folder and a path to it, or a file in
    it) accepted as two corpora: their fingerprints differ by the path named, and the folder's files were not
    compared, so its rows counted twice, in both splits, where `[ds, ds/train.jsonl]` was refused."""
    from tinylm.data.mixture import open_corpora

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds").mkdir()
    for split in ("train", "validation"):
        (tmp_path / "ds" / f"{split}.jsonl").write_text(json.dumps({"text": f"{split} row"}) + "\n")
    streamed = {"streaming": True, "max_documents": 1}  # (a glob is no stream)
    for specs, options in ((["hf:ds", "hf:./ds"], {}), (["hf:ds", "ds/train.jsonl"], {}), (["hf:ds", "ds/*"], {}),
                           (["hf:ds", "hf:./ds"], streamed), (["hf:ds", "ds/train.jsonl"], streamed)):
        with pytest.raises(ValueError, match="which both read the file .*: its text would count twice"):
            open_corpora(specs, cache_dir=tmp_path / "cache", **options)


def test_an_unwritable_dataset_cache_is_named_not_blamed_on_the_network(tmp_path):
    """Catches a local .jsonl whose Arrow cache (CACHE/hf-local) cannot be written (a read-only or full disk, a file
    in its place) ending in "could not load Hugging Face dataset 'json' ...; check the name and the network": the
    disk's error reaches the CLI as it is, which names the path and the fix."""
    from tinylm.cli.errors import is_user_error, one_line

    (tmp_path / "d.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "hf-local").write_text("")  # a file where the Arrow caches' folder goes
    with pytest.raises(NotADirectoryError) as e:
        list(open_corpus(str(tmp_path / "d.jsonl"), cache_dir=cache))
    assert is_user_error(e.value) and "network" not in one_line(e.value)
    assert one_line(e.value).startswith(f"NotADirectoryError: {cache / 'hf-local'} is a file, where a folder is needed")


def test_a_dataset_builder_without_data_files_is_refused(tmp_path, monkeypatch):
    """Catches `--data.corpus hf:json` without --data.data_files training on every data file of the current folder
    (what `datasets` reads then: here a stray .jsonl; elsewhere a parse error of some other .json, blamed on "the
    name and the network")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stray.jsonl").write_text('{"text": "not the corpus"}\n')
    for spec, streaming in (("hf:json", False), ("hf:text", False), ("hf:parquet", True)):
        with pytest.raises(ValueError, match=rf"--data.corpus {spec} reads local files and needs --data.data_files"):
            open_corpus(spec, cache_dir=tmp_path / "cache", streaming=streaming, max_documents=1)


def test_train_and_validation_data_files_apart_and_all_read(tmp_path):
    """Catches `--data.data_files {train: t.jsonl, validation: t.jsonl}` (or a train glob that matches the
    validation file too) scoring validation on training text: val/loss as low as the training loss, no warning."""
    for name in ("t", "v"):
        (tmp_path / f"{name}.jsonl").write_text(f'{{"text": "{name} row"}}\n')
    t, v, both = (str(tmp_path / n) for n in ("t.jsonl", "v.jsonl", "*.jsonl"))
    for files in ({"train": t, "validation": t}, {"train": both, "validation": v}):
        with pytest.raises(ValueError, match=r"gives the 'train' and 'validation' splits the same file .*\.jsonl: "
                                             r"validation would score text the model trains on"):
            open_corpus("hf:json", cache_dir=tmp_path / "cache", data_files=files)
    open_corpus("hf:json", cache_dir=tmp_path / "cache", data_files={"train": t, "validation": v})  # guard: apart
    # a split neither option reads: v.jsonl was never read, and validation was cut from the tail of train
    with pytest.raises(ValueError, match=r"data_files names the split 'val' and no 'validation' \(--data.val_split\), "
                                         r"so its files would never be read.*pass --data.val_split val"):
        open_corpus("hf:json", cache_dir=tmp_path / "cache", data_files={"train": t, "val": v})
    open_corpus("hf:json", cache_dir=tmp_path / "cache", data_files={"train": t, "val": v}, val_split="val")


def test_a_corpus_file_removed_while_it_is_read_is_one_line(tmp_path):
    """Catches a file of a corpus folder deleted during `prepare` ending in a FileNotFoundError traceback (from the
    size of the corpus that packing's bar reads) or a bare "No such file" without the fix."""
    folder = tmp_path / "d"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(f"text of {name}")
    corpus = open_corpus(str(folder), cache_dir=tmp_path / "cache")
    assert corpus.fingerprint and corpus.size_bytes == 2 * len("text of a.txt")
    (folder / "b.txt").unlink()
    said = rf"^corpus file {folder / 'b.txt'} was removed \(or renamed\) while the corpus was read; run again"
    with pytest.raises(corpus_mod.CorpusChanged, match=said):
        _ = corpus.size_bytes
    with pytest.raises(corpus_mod.CorpusChanged, match=said):
        list(corpus)
    (folder / "a.txt").unlink()  # listed, then removed before its fingerprint
    with pytest.raises(corpus_mod.CorpusChanged, match=rf"^corpus file {folder / 'a.txt'} was removed"):
        _ = corpus_mod.TextFiles(str(folder), [folder / "a.txt"]).fingerprint


def test_rows_without_the_text_column_are_counted_in_a_warning(tmp_path):
    """Catches a .jsonl whose rows put their text under other keys (or a null) losing them without a word: half
    the rows of a 300-row file were dropped, exit 0; and `{"text": 0}` dropped while `{"text": 42}` is refused."""
    rows = [{"text": f"story {i}"} if i % 2 else {"content": f"other {i}"} for i in range(10)] + [{"text": None}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for streaming in (False, True):
        corpus = open_corpus(str(tmp_path / "m.jsonl"), cache_dir=tmp_path / str(streaming), streaming=streaming,
                             **({"max_documents": 100, "val_fraction": 0.01} if streaming else {}))
        with pytest.warns(UserWarning) as said:
            docs = list(corpus.documents("train"))
            assert list(corpus.documents("train")) == docs  # a second pass (a stream is read in several): said once
        assert docs == [f"story {i}" for i in range(1, 10, 2)][streaming:]  # (a stream holds out its first)
        lines = [str(w.message) for w in said if "rows" in str(w.message)]
        assert lines == [f"corpus '{tmp_path / 'm.jsonl'}': 6 of the 11 rows read of its train split "
                         "have no 'text' (missing or null) and were skipped; if the text is in another column, pass "
                         "--data.text_column NAME"], lines
    with pytest.raises(ValueError, match=r"has no column 'body'; its columns are"):  # (streamed: an empty corpus)
        list(open_corpus(str(tmp_path / "m.jsonl"), cache_dir=tmp_path / "s", streaming=True, max_documents=5,
                         text_column="body").documents("train"))
    (tmp_path / "z.jsonl").write_text('{"text": "a"}\n{"text": 0}\n')
    with pytest.raises(ValueError, match=r"dataset '.*z\.jsonl': column 'text' holds int values \(e\.g\. '0'\)"):
        list(open_corpus(str(tmp_path / "z.jsonl"), cache_dir=tmp_path))


def test_local_dataset_files_are_named_by_their_files_not_their_loader(tmp_path):
    """Catches "dataset 'json' has no column 'text'" (the loader's name) for the user's own file, and a missing
    --data.data_files file blamed on the network."""
    (tmp_path / "rows.jsonl").write_text('{"body": "a"}\n')
    with pytest.raises(ValueError, match=rf"^dataset '{tmp_path / 'rows.jsonl'}' has no column 'text'"):
        list(open_corpus("hf:json", cache_dir=tmp_path, data_files=str(tmp_path / "rows.jsonl")))
    with pytest.raises(FileNotFoundError, match=r"^--data.data_files '.*nope\.jsonl' matches no file; check the"):
        list(open_corpus("hf:json", cache_dir=tmp_path, data_files=str(tmp_path / "nope.jsonl")))


@pytest.mark.parametrize("spec", ["hf:", "hf:/", "hf: "])
def test_a_dataset_spec_without_a_name_is_refused(tmp_path, spec):
    """Catches `--data.corpus hf:$DS` with DS unset ending in `datasets`' IndexError traceback."""
    with pytest.raises(ValueError, match=r"names no dataset \(an unset shell variable\?\); pass hf:NAME"):
        open_corpus(spec, cache_dir=tmp_path)


def test_a_dataset_named_at_a_revision_names_hf_revision(tmp_path):
    """Catches `--data.corpus hf:roneneldan/TinyStories@main` (a Hub name pinned as `--ckpt_path gpt2@main` is)
    sent to `datasets` whole: "Couldn't reach 'roneneldan/TinyStories@main' on the Hub ...; check the name and the
    network", which named neither the revision nor the option that takes it."""
    with pytest.raises(ValueError, match=r"^--data.corpus 'hf:org/ds@v1.0' names a revision in the dataset's name, "
                                         r"which `datasets` takes apart: pass --data.corpus hf:org/ds "
                                         r"--data.hf_revision v1.0$"):
        open_corpus("hf:org/ds@v1.0", cache_dir=tmp_path)


def test_datasets_own_bars_stay_out_of_a_log(tmp_path, capfd):
    """Catches `datasets`' "Generating train split" bar writing its carriage-return redraws into a log file
    (standard error no terminal), where tinylm's own progress writes lines."""
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(50)))
    assert len(list(open_corpus(str(tmp_path / "rows.jsonl"), cache_dir=tmp_path))) == 50
    err = capfd.readouterr().err
    assert "Generating" not in err and "\r" not in err, err


@pytest.mark.parametrize("streaming", [False, True])
def test_a_damaged_parquet_file_is_named_in_one_line(tmp_path, streaming):
    """Catches a .parquet cut short (an interrupted download) ending in pyarrow's ArrowInvalid traceback, and a
    corrupted one blamed on the network ("could not load Hugging Face dataset 'parquet' ...; check the name and the
    network")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tinylm.cli.errors import is_user_error

    pq.write_table(pa.table({"text": [f"story {i} " * 20 for i in range(50)]}), tmp_path / "good.parquet")
    whole = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[:300])
    corrupt = bytearray(whole)
    for i in range(100, len(corrupt) - 200, 7):
        corrupt[i] = 0x55
    (tmp_path / "bad.parquet").write_bytes(bytes(corrupt))
    for name in ("cut", "bad")[: 1 if streaming else 2]:
        said = rf"^could not read '.*{name}\.parquet' as a parquet dataset \(.*\); fix the file"
        with pytest.raises(ValueError, match=said) as raised:
            list(open_corpus(str(tmp_path / f"{name}.parquet"), cache_dir=tmp_path / name, streaming=streaming,
                             **({"max_documents": 10} if streaming else {})))
        assert is_user_error(raised.value)


@pytest.mark.parametrize("streaming", [False, True])
def test_rows_without_text_are_counted_over_the_whole_split_when_prepared(tmp_path, streaming):
    """Catches `tinylm prepare` saying "1 of the 2 rows read of its train split have no 'text'" for a .jsonl of
    which half the rows had none: the count came from the check that the corpus is not empty (which stops at its
    first document), and the full passes after it said nothing."""
    from tinylm.data.prepare import prepare_dataset, prepare_tokenizer

    rows = [{"text": f"story {i}"} if i % 2 else {"content": f"other {i}"} for i in range(40)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = open_corpus(str(tmp_path / "m.jsonl"), cache_dir=tmp_path / "c", streaming=streaming,
                         **({"max_documents": 100, "val_fraction": 0.1} if streaming else {}))
    with pytest.warns(UserWarning) as said:
        tok = prepare_tokenizer(corpus, "char", vocab_size=8192, cache_dir=tmp_path / "c")
        prepare_dataset(corpus, tok, val_fraction=0.1, cache_dir=tmp_path / "c")
    lines = [str(w.message) for w in said if "rows read" in str(w.message)]
    assert lines == [f"corpus '{tmp_path / 'm.jsonl'}': 20 of the 40 rows read of its train split have no 'text' "
                     "(missing or null) and were skipped; if the text is in another column, pass "
                     "--data.text_column NAME"], lines


def test_a_dataset_folder_is_read_from_inside_it_and_keeps_its_key_beside_runs(tmp_path, monkeypatch):
    """Catches `--data.corpus hf:.` (the current folder's train.jsonl and validation.jsonl) ending in `datasets`'
    traceback "dataset_name should be specified but got None"; the data cache inside an `hf:DIR` read as its files
    (the next run refused: "corpus file .../fingerprints.json changed while it was read"); and a run folder inside it
    (runs/NAME, written by each fit) changing its fingerprint: the resume refused as trained "on other text"."""
    folder = tmp_path / "stories"
    folder.mkdir()
    for split in ("train", "validation"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": f"{split} {i}"}) + "\n" for i in range(3)))
    monkeypatch.chdir(folder)
    for options in ({}, {"streaming": True}):
        corpus = open_corpus("hf:.", cache_dir=tmp_path / "cache", **options)
        assert list(corpus) == ["train 0", "train 1", "train 2"], options
        assert list(corpus.documents("validation")) == ["validation 0", "validation 1", "validation 2"], options
    with pytest.raises(ValueError, match=r"^corpus 'hf:\.' is a folder that holds the data cache data_cache .*; pass "
                                         rf"--data.cache_dir PATH outside {folder}$"):
        open_corpus("hf:.", cache_dir="data_cache")
    before = open_corpus(f"hf:{folder}", cache_dir=tmp_path / "cache").fingerprint
    run = folder / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"PK\3\4" + bytes(100))
    for name in (".lock", "config.yaml", "samples.txt"):
        (run / name).write_text("pid 1" if name == ".lock" else "text")
    assert open_corpus(f"hf:{folder}", cache_dir=tmp_path / "cache").fingerprint == before


def test_an_empty_split_file_of_a_dataset_folder_is_named(tmp_path):
    """Catches `--data.corpus hf:DIR` with an empty validation.jsonl beside a train.jsonl of rows saying "corpus
    has no rows (a header or blank lines only)", and an empty train.jsonl beside a validation.jsonl of rows saying
    "--data.data_files None matches no file" (an option never given)."""
    rows = "".join(json.dumps({"text": f"story {i}"}) + "\n" for i in range(20))
    for empty, said in (("validation", r"has no rows in its 'validation' split \(its files are empty"),
                        ("train", r"train\.jsonl has no rows \(empty, or blank lines only\); give it rows")):
        folder = tmp_path / empty
        folder.mkdir()
        for split in ("train", "validation"):
            (folder / f"{split}.jsonl").write_text("" if split == empty else rows)
        with pytest.raises(ValueError, match=rf"^corpus 'hf:{folder}'.*{said}"):
            list(open_corpus(f"hf:{folder}", cache_dir=tmp_path / "c"))


def test_utf16_text_is_named_as_such(tmp_path):
    """Catches a UTF-16 file (Windows Notepad's "Unicode", PowerShell's `>`) refused as "looks binary, not text",
    and a short one trained on as text with a NUL between every two characters (too few bad bytes to refuse)."""
    for name, text in (("short.txt", "hi there\n"), ("long.txt", "Once upon a time. " * 200)):
        (tmp_path / name).write_bytes(text.encode("utf-16"))  # (with its byte-order mark)
        with pytest.raises(ValueError, match=rf"{name} is UTF-16 text .* iconv -f UTF-16 -t UTF-8"):
            list(open_corpus(str(tmp_path / name), cache_dir=tmp_path))


def test_a_utf8_byte_order_mark_is_no_text(tmp_path):
    """Catches the BOM of a file saved as "UTF-8 with BOM" (Windows Notepad) read as a character U+FEFF at the start
    of every such file's first document (the model learned to write it after each end of text), and an "empty"
    file Notepad saved (its 3 BOM bytes) refused as "a single distinct character ('\\ufeff')" or "the train split
    has 0 tokens ... use a smaller --data.block_size" instead of as an empty corpus."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "a.txt").write_bytes(bom + f"first{EOT}second\n".encode())
    (tmp_path / "b.txt").write_bytes(bom + "caf\u00e9\r\n".encode())
    assert list(open_corpus(str(tmp_path / "a.txt"), cache_dir=tmp_path)) == ["first", "second"]
    assert list(open_corpus(str(tmp_path / "b.txt"), cache_dir=tmp_path)) == ["caf\u00e9\r\n"]
    (tmp_path / "empty.txt").write_bytes(bom)
    assert list(open_corpus(str(tmp_path / "empty.txt"), cache_dir=tmp_path)) == []
    (tmp_path / "mid.txt").write_bytes(b"a" + bom + b"b")  # (inside the text it is a character, kept)
    assert list(open_corpus(str(tmp_path / "mid.txt"), cache_dir=tmp_path)) == ["a\ufeffb"]


def test_a_small_compressed_file_is_named_not_trained_on(tmp_path):
    """Catches a compressed corpus file too small to pass the binary check's 32 bad bytes (an 86-byte .zst of a
    2.4 KB text) trained on as text, with warnings of NUL bytes and U+FFFD, instead of "is zstd-compressed"."""
    import bz2
    import gzip
    import lzma

    text = ("Hello world.\n" * 200).encode()
    zstd = bytes.fromhex("28b52ffd2000690000") + b"Hello world.\n"  # (a zstd frame's header; enough for the magic)
    for name, data in (("t.gz", gzip.compress(text)), ("t.xz", lzma.compress(text)), ("t.bz2", bz2.compress(text)),
                       ("t.zst", zstd)):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=rf"{name} is \w+-compressed, not text: .* decompress it first"):
            list(open_corpus(str(tmp_path / name), cache_dir=tmp_path))
    (tmp_path / "bzh.txt").write_text("BZh is how this text starts.\n")  # bzip2's first 3 bytes alone: text
    assert list(open_corpus(str(tmp_path / "bzh.txt"), cache_dir=tmp_path)) == ["BZh is how this text starts.\n"]


@pytest.mark.parametrize("streaming", [False, True])
def test_compressed_dataset_files_are_named_with_what_reads_them(tmp_path, monkeypatch, streaming):
    """Catches a .jsonl.zst (SlimPajama's, Dolma's shards) without the zstandard package refused as "could not read
    ... (ValueError: Compression type zstd not supported); fix the file" (the file is fine: a package is missing),
    and a .jsonl.gz named as the corpus told only to decompress it, when hf:json reads its rows as they are."""
    import gzip

    import fsspec.compression

    rows = "".join(json.dumps({"text": f"story {i}"}) + "\n" for i in range(10)).encode()
    (tmp_path / "rows.jsonl.gz").write_bytes(gzip.compress(rows))
    options = {"streaming": True, "max_documents": 8} if streaming else {}
    with pytest.raises(ValueError, match=r"rows\.jsonl\.gz is gzip-compressed, not text: .* or read its rows as they "
                                         r"are: --data.corpus hf:json --data.data_files .*rows\.jsonl\.gz$"):
        list(open_corpus(str(tmp_path / "rows.jsonl.gz"), cache_dir=tmp_path / "c"))
    read = open_corpus("hf:json", data_files=str(tmp_path / "rows.jsonl.gz"), cache_dir=tmp_path / "c", **options)
    assert list(read)[:2] == (["story 1", "story 2"] if streaming else ["story 0", "story 1"])
    monkeypatch.delitem(fsspec.compression.compr, "zstd", raising=False)  # (as where zstandard is not installed)
    (tmp_path / "rows.jsonl.zst").write_bytes(bytes.fromhex("28b52ffd2000690000") + rows)
    with pytest.raises(ValueError, match=r"^could not read '.*rows\.jsonl\.zst': it is zstd-compressed, and `datasets` "
                                         r"reads that with the zstandard package, .*; pip install zstandard, or "):
        list(open_corpus("hf:json", data_files=str(tmp_path / "rows.jsonl.zst"), cache_dir=tmp_path / "c", **options))


def test_a_symlinked_folder_of_a_corpus_folder_is_read(tmp_path):
    """Catches `--data.corpus corpus` leaving out without a word the files of `corpus/wiki -> /data/wiki` (a
    symlinked folder), which `--data.corpus 'corpus/**/*.txt'` reads; a loop (sub/loop -> corpus) is read once."""
    (tmp_path / "data" / "wiki").mkdir(parents=True)
    (tmp_path / "data" / "wiki" / "w.txt").write_text("wiki text")
    d = tmp_path / "corpus"
    (d / "own").mkdir(parents=True)
    (d / "own" / "a.txt").write_text("own text")
    (d / "wiki").symlink_to(tmp_path / "data" / "wiki", target_is_directory=True)
    (d / "own" / "loop").symlink_to(d, target_is_directory=True)
    want = ["own text", "wiki text"]
    assert list(open_corpus(str(d / "**" / "*.txt"), cache_dir=tmp_path / "c")) == want
    assert list(open_corpus(str(d), cache_dir=tmp_path / "c")) == want


def test_a_text_corpus_is_hashed_once_while_its_files_keep_their_stamps(tmp_path, monkeypatch):
    """Prevents every command (and every rank) from reading the whole text corpus again for its fingerprint (~100 s
    for a 45 GB corpus at each start): the fingerprint is remembered in the cache folder by the files' stamps, is
    the one a fresh hash gives, and is taken anew after an edit (a same-size one too) or when a file changed too
    recently for its stamp to be trusted."""
    import tinylm.data.corpus as corpus_mod
    import tinylm.data.source as source_mod
    from tinylm.data.corpus import TextFiles

    hashed = []
    real = corpus_mod._sha256
    monkeypatch.setattr(corpus_mod, "_sha256", lambda path, h: (hashed.append(path), real(path, h))[1])
    monkeypatch.setattr(source_mod, "RACY_NS", 10**18)  # "just written" however slowly this machine got here
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one document\n")
    b.write_text("another\n")
    spec = str(tmp_path / "*.txt")
    cache = tmp_path / "cache"
    first = open_corpus(spec, cache_dir=cache).fingerprint
    assert open_corpus(spec, cache_dir=cache).fingerprint == first and len(hashed) == 4  # just written: not trusted
    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    hashed.clear()
    assert open_corpus(spec, cache_dir=cache).fingerprint == first and len(hashed) == 2
    assert open_corpus(spec, cache_dir=cache).fingerprint == first and len(hashed) == 2  # remembered
    assert TextFiles(spec, [a, b]).fingerprint == first and len(hashed) == 4  # the same as hashing, no memo
    b.write_text("ANOTHER\n")  # same size, other text
    changed = open_corpus(spec, cache_dir=cache).fingerprint
    assert changed != first and len(hashed) == 6
    assert open_corpus(spec, cache_dir=cache).fingerprint == changed and len(hashed) == 6
    (cache / corpus_mod.FINGERPRINTS).unlink()
    (cache / corpus_mod.FINGERPRINTS).mkdir()  # a memo that cannot be read or written: hashed every time
    assert open_corpus(spec, cache_dir=cache).fingerprint == changed and len(hashed) == 8


def test_the_fingerprint_memo_stays_small_for_a_corpus_of_many_files(tmp_path, monkeypatch):
    """Catches fingerprints.json growing with the number of files times the number of versions remembered: each
    entry's key was the list of every file's path and stamp (~120 bytes a file), so a folder of 5,000 files made
    a 0.6 MB entry per edit (23 MB after 40 edits, read and written whole at every start; 150 MB at the 256-entry
    cap, and ~120 MB per entry for a million files)."""
    import tinylm.data.corpus as corpus_mod
    import tinylm.data.source as source_mod

    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    folder = tmp_path / "wiki"
    folder.mkdir()
    for i in range(200):
        (folder / f"article_{i:06d}.txt").write_text(f"text {i}\n")
    cache = tmp_path / "cache"
    for _ in range(5):  # five edits, five entries
        with open(folder / "article_000000.txt", "a") as f:
            f.write("x")
        fingerprint = open_corpus(str(folder), cache_dir=cache).fingerprint
        assert open_corpus(str(folder), cache_dir=cache).fingerprint == fingerprint  # remembered
    assert (cache / corpus_mod.FINGERPRINTS).stat().st_size < 200 * 5  # 5 entries of a fixed size


def test_a_fingerprint_memo_nested_too_deep_is_taken_for_damaged(tmp_path, monkeypatch):
    """Catches a garbage fingerprints.json ending every command that names a text corpus in a RecursionError
    traceback (json raises it, not a ValueError, for arrays nested ~100k deep): it is ignored and written anew."""
    import tinylm.data.corpus as corpus_mod
    import tinylm.data.source as source_mod

    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    (tmp_path / "a.txt").write_text("one document\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / corpus_mod.FINGERPRINTS).write_text("[" * 200_000)
    want = corpus_mod.TextFiles("a", [tmp_path / "a.txt"]).fingerprint
    assert open_corpus(str(tmp_path / "a.txt"), cache_dir=cache).fingerprint == want
    assert open_corpus(str(tmp_path / "a.txt"), cache_dir=cache).fingerprint == want  # from the memo written anew


@pytest.mark.parametrize("streaming", [False, True])
def test_local_dataset_files_are_hashed_once_while_they_keep_their_stamps(tmp_path, monkeypatch, streaming):
    """Prevents every command (and rank) from reading a local dataset's files whole again for their hashes (a folder
    of parquet shards: minutes at each start): remembered in the cache folder by the files' stamps, the same
    fingerprint as hashing, hashed again after an edit; streamed (--data.streaming) too."""
    import tinylm.data.hf_corpus as hf_mod
    import tinylm.data.source as source_mod

    hashed = []
    real = hf_mod._sha256
    monkeypatch.setattr(hf_mod, "_sha256", lambda path: (hashed.append(path), real(path))[1])
    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "hello world"}) + "\n")
    cache = tmp_path / "cache"
    def corpus(cache_dir):
        return open_corpus(str(path), cache_dir=cache_dir, streaming=streaming, max_documents=1 if streaming else None)

    first = corpus(cache).fingerprint
    assert corpus(cache).fingerprint == first and len(hashed) == 1  # remembered
    assert corpus(tmp_path / "other").fingerprint == first and len(hashed) == 2
    path.write_text(json.dumps({"text": "hello there"}) + "\n")  # same size, other text
    edited = corpus(cache)
    assert edited.fingerprint != first and len(hashed) == 3
    assert streaming or list(edited) == ["hello there"]  # (a stream of one document holds it out for validation)


def test_a_memo_temp_file_left_by_a_killed_process_is_removed(tmp_path, monkeypatch):
    """Catches `CACHE/fingerprints.json.tmp-<host>-<pid>` (and a dataset's `ids_checked.json.tmp-...`) left in the
    cache for good by a process killed between writing it and renaming it into place: nothing removed it, and a
    cache shared by many killed jobs gathered one per kill. A process that is gone is a dead pid here; the live
    writer's own temp file is left alone."""
    import socket

    import tinylm.data.corpus as corpus_mod
    import tinylm.data.source as source_mod

    monkeypatch.setattr(source_mod, "RACY_NS", 0)
    (tmp_path / "a.txt").write_text("one document\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid no process holds now
    stale = cache / f"{corpus_mod.FINGERPRINTS}.tmp-{socket.gethostname()}-{dead.pid}"
    stale.write_text('{"half": ')  # what `kill -9` between the write and the rename leaves
    other_host = cache / f"{corpus_mod.FINGERPRINTS}.tmp-another-host-{dead.pid}"
    other_host.write_text("{}")  # (another machine sharing the cache: its process cannot be asked)
    memo = cache / corpus_mod.FINGERPRINTS
    source_mod.remember(memo, "key", "value", stamps=[(0, 0)])  # (what open_corpus does after hashing a corpus)
    assert source_mod.recalled(memo, "key") == "value"
    assert not stale.exists()
    assert other_host.exists()


@pytest.mark.parametrize("spec", ["d", "d/*.txt"], ids=["folder", "glob"])
def test_a_folder_of_many_files_has_each_files_real_path_worked_out_once(tmp_path, monkeypatch, spec):
    """Catches the files of a folder or glob corpus each having its real path (a system call per folder of its path)
    worked out once per file or folder of tinylm's own cache it was compared with: 6 a file, 1.7 s of CPU for a
    folder of 20,000 files at every command's start on every rank, where one a file took 0.3 s."""
    from tinylm.data import local_files

    (tmp_path / "d").mkdir()
    for i in range(40):
        (tmp_path / "d" / f"{i:02d}.txt").write_text(f"text {i}")
    (tmp_path / "cache").mkdir()
    calls = []
    real = os.path.realpath
    monkeypatch.setattr(local_files.os.path, "realpath", lambda p, **kw: calls.append(p) or real(p, **kw))
    found = (local_files.glob_files(str(tmp_path / spec), cache_dir=tmp_path / "cache") if "*" in spec else
             local_files.files_below(tmp_path / spec, cache_dir=tmp_path / "cache"))
    assert len(found) == 40  # (not vacuous: every file was looked at)
    assert len(calls) <= 40 + 10, f"{len(calls)} real paths worked out for 40 files"
