"""Listings that carry their files (``inline=N``): the validator's pending list and the trainer's accepted window
bring the submissions' bytes along, within the orchestrator's inline budget, so neither downloads them one by one."""

from __future__ import annotations

import base64
import hashlib

from protocol_support import make_cfg, rollouts_for, running, write

from swarmrl.protocol.client import NodeClient, TrainerClient, ValidatorClient
from swarmrl.protocol.schemas import InlineFile, VerdictRequest
from swarmrl.protocol.signing import generate_key


class _CountingValidator(ValidatorClient):
    downloads = 0

    def download(self, submission_id, out, max_bytes: int = 256 << 20) -> str:  # noqa: ANN001
        type(self).downloads += 1
        return super().download(submission_id, out, max_bytes)


def _upload(srv, tmp_path, name: str) -> tuple[int, bytes]:  # noqa: ANN001
    node = NodeClient(srv.url, generate_key())
    node.register(throughput=10.0, stake=100.0)
    a = node.heartbeat().assignments[0]
    path = write(rollouts_for(node.node_id, a), tmp_path / f"{name}.parquet")
    return node.submit(a.assignment_id, path).submission_id, path.read_bytes()


def test_the_pending_list_carries_the_files_and_the_validator_downloads_none(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        sid, data = _upload(srv, tmp_path, "a")
        v = _CountingValidator(srv.url, keys["validator"])
        got = v.pending(inline=16)
        assert [f.submission_id for f in got.files] == [sid]
        out = tmp_path / "got.parquet"
        sha = v.fetch_file(sid, out, {f.submission_id: f for f in got.files})
        assert out.read_bytes() == data and sha == hashlib.sha256(data).hexdigest() == got.items[0].submission.sha256
        assert _CountingValidator.downloads == 0
        assert v.pending().files == []  # not asked: not sent
        v.fetch_file(sid, tmp_path / "dl.parquet", {})  # not inline: downloaded
        assert _CountingValidator.downloads == 1 and (tmp_path / "dl.parquet").read_bytes() == data


def test_the_inline_budget_leaves_big_files_to_downloads(tmp_path):
    cfg, keys = make_cfg(tmp_path, inline_file_bytes=100)  # smaller than any rollout file
    with running(cfg, run_sweeper=False) as srv:
        _upload(srv, tmp_path, "a")
        v = ValidatorClient(srv.url, keys["validator"])
        assert len(v.pending().items) == 1 and v.pending(inline=16).files == []
    cfg, keys = make_cfg(tmp_path / "b", inline_total_bytes=1)
    with running(cfg, run_sweeper=False) as srv:
        _upload(srv, tmp_path, "b")
        assert ValidatorClient(srv.url, keys["validator"]).pending(inline=16).files == []


def test_an_inline_file_over_the_clients_limit_is_downloaded_instead(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        sid, data = _upload(srv, tmp_path, "a")
        v = _CountingValidator(srv.url, keys["validator"])
        _CountingValidator.downloads = 0
        huge = InlineFile(submission_id=sid, data=base64.b64encode(b"x" * (len(data) + 300)).decode())
        v.fetch_file(sid, tmp_path / "x.parquet", {sid: huge}, max_bytes=len(data))
        assert _CountingValidator.downloads == 1 and (tmp_path / "x.parquet").read_bytes() == data


def test_the_accepted_window_inlines_only_what_the_trainer_does_not_hold(tmp_path):
    cfg, keys = make_cfg(tmp_path)
    with running(cfg, run_sweeper=False) as srv:
        s1, d1 = _upload(srv, tmp_path, "a")
        s2, d2 = _upload(srv, tmp_path, "b")
        v = ValidatorClient(srv.url, keys["validator"])
        for sid in (s1, s2):
            v.verdict(VerdictRequest(submission_id=sid, accepted=True, reason="ok"))
        t = TrainerClient(srv.url, keys["trainer"])
        assert {it.submission_id for it in t.accepted_window().items} == {s1, s2}
        assert t.accepted_window().files == []
        got = t.accepted_window(inline=16, have=[s1])
        assert [(f.submission_id, f.decoded(1 << 20)) for f in got.files] == [(s2, d2)]
        assert {f.submission_id for f in t.accepted_window(inline=16).files} == {s1, s2}
        assert [f.submission_id for f in t.accepted_window(inline=1).files] == [s1]
