"""The S3 tier: committed persistent checkpoints copied to S3 in the background.

Layout in S3 (``uri`` = ``s3://bucket/prefix``)::

    s3://bucket/prefix/<job_id>/step-00000099/.metadata
    s3://bucket/prefix/<job_id>/step-00000099/__0_0.distcp ...       every file of the checkpoint
    s3://bucket/prefix/<job_id>/step-00000099/COMMITTED              the commit marker, LAST

The tier uploads what the persistent tier (:class:`~hyperpod_lab.runtime.checkpoint.persistent.Checkpointer`)
already committed on shared storage, so only rank 0 uploads: every rank's shard files are in
the same directory. A step is *complete* in S3 only when its ``COMMITTED`` object exists, and that
object (the persistent marker, byte for byte: every file's size, CRC-32 and SHA-256, signed with
the job's checkpoint key) is uploaded after every other file of the step finished uploading, so
"the marker exists" means "every shard is there". :meth:`S3Tier.download` checks every file
against the marker; a restore (:meth:`S3Tier.restore_into`) first authenticates the marker's HMAC
(:func:`~hyperpod_lab.runtime.checkpoint.format.authenticate_marker`), so an object others could
write to the prefix is never downloaded into a checkpoint, let alone unpickled by DCP, unless the
job's key signed it: an unsigned, tampered or foreign-key step is skipped with
``checkpoint.corrupt`` ("authentication failed"). A re-upload of a step first
deletes the step's marker, so a mix of old and new shards never looks complete.

Uploads run in one daemon thread per process. Large files go up as multipart uploads (boto3's
transfer manager; ``multipart_threshold``/``multipart_chunksize`` in bytes, S3 requires parts of
at least 5 MiB so smaller chunk sizes are raised to that). A failed attempt emits
``checkpoint.failed`` {tier: "s3", step, reason, attempt, will_retry, retry_in_s, path} and is
retried after ``backoff_s * 2**(n-1)`` seconds (capped at ``max_backoff_s``); after
``max_attempts`` failed attempts the upload is re-queued and tried again ``requeue_after_s``
seconds later, until it succeeds or a newer step supersedes it. Nothing ever raises into
training. Success emits ``checkpoint.saved`` {tier: "s3", step, bytes, blocked_s (seconds
:meth:`S3Tier.maybe_upload` blocked its caller, ~0), total_s (seconds from that call until the
marker was uploaded), path (the step's S3 URI)}, then retention keeps the ``keep_last`` newest
complete steps (never fewer than the newest one), deletes older ones (marker first) and
incomplete steps older than the newest complete one, and aborts their stale multipart uploads.

Only the newest pending step matters: enqueueing step N drops queued (not yet running) uploads of
older steps with a ``checkpoint.failed`` {will_retry: false, reason: "superseded ..."} event, so
a slow or unreachable S3 never builds a backlog, and the local directories the persistent tier's
retention must keep (:meth:`S3Tier.pinned_dirs`) stay at most two.

Endpoint: ``endpoint_url``, else ``$HYPERPOD_LAB_S3_ENDPOINT_URL``, else ``$AWS_ENDPOINT_URL_S3``,
else ``$AWS_ENDPOINT_URL``, else AWS's default for the region. Credentials and region come from
boto3's usual chain (environment, profile, instance role). botocore's own retries are turned off
(this tier retries), connect timeout 10 s, read timeout 60 s.

Shared prefix (``shared=True``, checkpointless jobs): the replica groups take turns writing the
persistent checkpoint and each writer's rank 0 uploads the step it committed, so one group's
upload may still be running when another group's finishes. Retention then deletes an incomplete
step (and aborts its multipart uploads) only when it is older than the oldest complete step it
keeps, a step retention would delete anyway once complete; and a restore downloads into a
private ``<root>/.s3-download-<random>/`` first and moves the verified, loaded step to
``<root>/step-XXXXXXXX/`` only if no other group put it there first, so groups restoring at the
same moment never write into each other's files.

boto3 is imported on first use, so constructing the tier costs nothing until it uploads.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.events import EventKind
from hyperpod_lab.jobdir import ENV_S3_ENDPOINT, TIER_S3
from hyperpod_lab.runtime.checkpoint.format import (
    COMMIT_MARKER,
    METADATA_FILE,
    authenticate_marker,
    check_file,
    dir_bytes,
    file_checksum,
    parse_marker,
    read_marker,
    safe_relpath,
    short_error,
    state_mismatch,
    step_dir_name,
)

if TYPE_CHECKING:  # pragma: no cover
    from hyperpod_lab.runtime.context import JobContext

MIN_PART_BYTES = 5 << 20  # S3's minimum multipart part size (all parts but the last)
_URI = re.compile(r"^s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(.*))?$")
_STEP_KEY = re.compile(r"^step-(\d{8,})/(.+)$")



class LocalCheckpoints(Protocol):
    """What the S3 tier needs of the persistent tier it restores into
    (:class:`~hyperpod_lab.runtime.checkpoint.persistent.Checkpointer`): its root directory, a
    broadcast from rank 0 and a verified load of one step directory (None, or the error)."""

    root: str

    def broadcast(self, obj: Any) -> Any: ...

    def load_dir(self, dcp_state: dict[str, Any], path: str) -> str | None: ...


class S3TierError(RuntimeError):
    """An S3 operation of the tier failed (unreachable endpoint, credentials, missing bucket...)."""


class S3CheckpointCorrupt(S3TierError):
    """A step in S3 is unusable: its marker is missing or unreadable, or a file is missing or does
    not match the marker's size/checksum.

    Attributes:
        key: the S3 URI of the offending object (``s3://bucket/.../step-XXXXXXXX/<file>``).
        reason: what is wrong with it.
    """

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key, self.reason = key, reason


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/prefix`` into ``(bucket, prefix)``; the prefix is ``""`` or ends in ``/``.

    Raises:
        ValueError: not an ``s3://`` URI with a valid bucket name.
    """
    m = _URI.match(uri) if isinstance(uri, str) else None
    if not m:
        raise ValueError(f"not an S3 URI: {uri!r} (expected s3://bucket/prefix, bucket names are 3-63 "
                         f"characters of a-z, 0-9, '.' and '-')")
    prefix = (m.group(2) or "").strip("/")
    return m.group(1), (prefix + "/" if prefix else "")


def describe_error(exc: BaseException, endpoint: str | None = None, bucket: str | None = None) -> str:
    """One line saying what went wrong with an S3 call and, where known, what to do about it."""
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    code = ""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str((response.get("Error") or {}).get("Code") or "")
    if name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"):
        out = (f"{name}: no usable AWS credentials (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
               f"AWS_PROFILE, or run with an instance role)")
    elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError",
                  "ConnectionError", "ProxyConnectionError"):
        out = f"{name}: cannot reach the S3 endpoint {endpoint or '(AWS default)'}: {text}"
    elif code in ("NoSuchBucket",):
        out = f"NoSuchBucket: bucket {bucket!r} does not exist (create it, or fix checkpoint.s3_uri)"
    elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "403"):
        out = f"{code}: {text} (check the AWS credentials and the bucket policy for {bucket!r})"
    else:
        out = f"{name}: {text}"
    return out if len(out) <= 500 else out[:497] + "..."


@dataclass
class _Upload:
    step: int
    local_dir: str
    enqueued: float  # time.monotonic() of maybe_upload
    blocked_s: float
    attempts: int = 0  # attempts made, over all rounds
    not_before: float = 0.0  # monotonic time before which the worker leaves it alone
    gave_up: bool = False  # its last round of attempts failed; it waits for not_before


class S3Tier:
    """Uploads committed persistent checkpoints to s3://bucket/prefix/<job_id>/step-XXXXXXXX/...

    Construct it on every rank (only rank 0 uploads; any rank may list and download) and pass it
    to the persistent tier: ``Checkpointer(ctx, s3=S3Tier(ctx, uri, every_steps=100))``. It
    registers itself with ``ctx``, so ``ctx.finish`` waits for its uploads (:meth:`wait`) and
    closes it. That wait happens on rank 0 before the final barrier, whose timeout is
    ``$HYPERPOD_LAB_CHECKPOINT_TIMEOUT_S`` (600 s): a last upload longer than that would time
    the other ranks out; raise the variable for very large checkpoints.

    Args:
        ctx: the job's :class:`~hyperpod_lab.runtime.context.JobContext`; ``ctx.job_id`` names
            the job's folder under the prefix.
        uri: ``s3://bucket/prefix``. A malformed URI does not raise: it emits
            ``checkpoint.failed`` {tier: "s3", step: null, will_retry: false} on rank 0 and
            disables the tier (``error`` says why).
        every_steps: upload when ``(step + 1) % every_steps == 0`` (a multiple of the persistent
            tier's interval, so that those steps are committed locally).
        keep_last: complete steps to keep in S3 (>= 1; the newest is never deleted).
        endpoint_url: S3 endpoint; default see the module docstring.
        max_attempts: attempts per round before the upload is re-queued (>= 1).
        backoff_s: seconds before the 2nd attempt of a round, doubling after each failure.
        max_backoff_s: cap of that delay, seconds.
        requeue_after_s: seconds after a failed round before the next round.
        multipart_threshold: files of at least this many bytes are uploaded/downloaded in parts.
        multipart_chunksize: part size in bytes (raised to S3's 5 MiB minimum).
        max_concurrency: parallel part transfers.
        connect_timeout_s, read_timeout_s: socket timeouts of each S3 request, seconds.
        shared: several replica groups upload to this job's prefix in turn (see the module
            docstring).

    Raises:
        ValueError: ``every_steps``, ``keep_last`` or ``max_attempts`` is not a whole number >= 1,
            or a delay is negative.
    """

    def __init__(self, ctx: "JobContext", uri: str, every_steps: int, keep_last: int = 2, *,
                 endpoint_url: str | None = None, max_attempts: int = 5, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, requeue_after_s: float = 60.0,
                 multipart_threshold: int = 64 << 20, multipart_chunksize: int = 16 << 20,
                 max_concurrency: int = 8, connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0,
                 shared: bool = False):
        for name, v in (("every_steps", every_steps), ("keep_last", keep_last), ("max_attempts", max_attempts),
                        ("multipart_threshold", multipart_threshold), ("multipart_chunksize", multipart_chunksize),
                        ("max_concurrency", max_concurrency)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"S3Tier {name} must be a whole number >= 1, got {v!r}")
        for name, v in (("backoff_s", backoff_s), ("max_backoff_s", max_backoff_s),
                        ("requeue_after_s", requeue_after_s)):
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"S3Tier {name} must be a number of seconds >= 0, got {v!r}")
        self.ctx, self.uri = ctx, uri
        self.every_steps, self.keep_last, self.max_attempts = every_steps, keep_last, max_attempts
        self.backoff_s, self.max_backoff_s, self.requeue_after_s = backoff_s, max_backoff_s, requeue_after_s
        self.multipart_threshold = multipart_threshold
        self.multipart_chunksize = max(multipart_chunksize, MIN_PART_BYTES)
        self.max_concurrency = max_concurrency
        self.shared = bool(shared)
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self.endpoint_url = (endpoint_url or os.environ.get(ENV_S3_ENDPOINT) or os.environ.get("AWS_ENDPOINT_URL_S3")
                             or os.environ.get("AWS_ENDPOINT_URL") or None)
        self.error: str | None = None  # why the tier is disabled, or None
        self.bucket, self.prefix = "", ""
        try:
            self.bucket, self.prefix = parse_s3_uri(uri)
        except ValueError as e:
            self.error = str(e)
            if ctx.rank == 0:
                ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_S3, step=None, attempt=0, will_retry=False,
                         reason=f"S3 tier disabled: {e}", path=str(uri))
            print(f"hyperpod-lab: S3 tier disabled: {e}", file=sys.stderr, flush=True)
        self.base = f"{self.prefix}{ctx.job_id}/"  # key prefix of this job's steps
        self._client_obj = None
        self._client_lock = threading.Lock()
        self._cv = threading.Condition()
        self._queue: list[_Upload] = []
        self._inflight: _Upload | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        ctx.register_checkpointer(self)

    @classmethod
    def from_spec(cls, ctx: "JobContext", **kwargs: Any) -> "S3Tier | None":
        """The tier the job's spec asks for (``checkpoint.s3_uri``/``s3_every_steps``), or None."""
        policy = ctx.spec.checkpoint if ctx.spec is not None else None
        if policy is None or not policy.s3_uri:
            return None
        return cls(ctx, policy.s3_uri, policy.s3_every_steps or policy.every_steps, **kwargs)

    # ---- naming -------------------------------------------------------------------------------
    def step_uri(self, step: int) -> str:
        """``s3://bucket/prefix/<job_id>/step-XXXXXXXX/``."""
        return f"s3://{self.bucket}/{self.base}{step_dir_name(step)}/"

    def _key(self, step: int, rel: str = "") -> str:
        return f"{self.base}{step_dir_name(step)}/{rel}"

    def _client(self):
        with self._client_lock:
            if self._client_obj is None:
                import boto3
                from botocore.config import Config

                cfg = Config(connect_timeout=self._timeouts[0], read_timeout=self._timeouts[1],
                             retries={"total_max_attempts": 1, "mode": "standard"},
                             max_pool_connections=max(10, 2 * self.max_concurrency))
                self._client_obj = boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, config=cfg)
            return self._client_obj

    def _transfer_manager(self):
        from boto3.s3.transfer import TransferConfig, create_transfer_manager

        config = TransferConfig(multipart_threshold=self.multipart_threshold,
                                multipart_chunksize=self.multipart_chunksize,
                                max_concurrency=self.max_concurrency, use_threads=True)
        return create_transfer_manager(self._client(), config)

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc, self.endpoint_url, self.bucket)

    # ---- uploading ----------------------------------------------------------------------------
    def maybe_upload(self, step: int, local_dir: str) -> bool:
        """On rank 0, every ``every_steps`` steps: queue a background upload of a committed
        persistent checkpoint directory. Returns at once; never raises into training.

        Args:
            step: the 0-based step the checkpoint was taken after.
            local_dir: its directory (with its ``COMMITTED`` marker) on shared storage.

        Returns:
            True if the upload was queued; False on other ranks, off-interval steps, or when the
            tier is disabled or closed.
        """
        t0 = time.monotonic()
        step = int(step)
        if self.ctx.rank != 0 or self.error is not None or self._closed or (step + 1) % self.every_steps:
            return False
        with self._cv:
            superseded = [j for j in self._queue if j.step < step]
            self._queue = [j for j in self._queue if j.step > step]
            job = _Upload(step=step, local_dir=os.path.abspath(local_dir), enqueued=t0, blocked_s=0.0)
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._worker, name="hyperpod-s3-upload", daemon=True)
                self._thread.start()
            job.blocked_s = time.monotonic() - t0
            self._cv.notify_all()
        for old in superseded:
            self._failed(old, f"superseded by step {step} before it reached S3", will_retry=False)
        return True

    def pinned_dirs(self) -> set[str]:
        """Absolute local directories queued or being uploaded: the persistent tier's retention
        keeps them."""
        with self._cv:
            dirs = {j.local_dir for j in self._queue}
            if self._inflight is not None:
                dirs.add(self._inflight.local_dir)
            return dirs

    def _failed(self, job: _Upload, reason: str, will_retry: bool, retry_in_s: float | None = None) -> None:
        self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_S3, step=job.step, reason=reason, attempt=job.attempts,
                      will_retry=will_retry, retry_in_s=retry_in_s, path=self.step_uri(job.step))

    def _worker(self) -> None:
        while True:
            with self._cv:
                while True:
                    if self._closed:
                        return
                    now = time.monotonic()
                    ready = [j for j in self._queue if j.not_before <= now]
                    if ready:
                        job = max(ready, key=lambda j: j.step)
                        self._queue.remove(job)
                        job.gave_up = False
                        self._inflight = job
                        break
                    timeout = min((j.not_before for j in self._queue), default=now + 3600) - now
                    self._cv.wait(max(0.01, timeout))
            try:
                self._run(job)
            except BaseException as e:
                print(f"hyperpod-lab: S3 upload worker error: {e!r}", file=sys.stderr, flush=True)
            finally:
                with self._cv:
                    self._inflight = None
                    self._cv.notify_all()

    def _run(self, job: _Upload) -> None:
        """One round of up to ``max_attempts`` attempts; re-queue the job if all fail."""
        for i in range(self.max_attempts):
            if self._closed:
                self._failed(job, "S3 tier closed before the upload finished", will_retry=False)
                return
            if not os.path.exists(os.path.join(job.local_dir, COMMIT_MARKER)):
                self._failed(job, f"the local checkpoint {job.local_dir} is gone or not committed", will_retry=False)
                return
            job.attempts += 1
            try:
                nbytes = self._upload_once(job)
            except Exception as e:
                last = i == self.max_attempts - 1
                delay = self.requeue_after_s if last else min(self.max_backoff_s, self.backoff_s * 2 ** i)
                self._failed(job, self._describe(e), will_retry=not self._closed, retry_in_s=delay)
                if not last:
                    with self._cv:
                        self._cv.wait_for(lambda: self._closed, timeout=delay)
                continue
            self.ctx.emit(EventKind.CHECKPOINT_SAVED, tier=TIER_S3, step=job.step, bytes=nbytes,
                          blocked_s=job.blocked_s, total_s=time.monotonic() - job.enqueued,
                          path=self.step_uri(job.step), attempts=job.attempts)
            try:
                self._retain()
            except Exception as e:
                print(f"hyperpod-lab: S3 retention failed: {self._describe(e)}", file=sys.stderr, flush=True)
            return
        with self._cv:
            if self._closed:
                superseded_by = None
            else:
                superseded_by = max((j.step for j in self._queue if j.step > job.step), default=None)
            if not self._closed and superseded_by is None:
                job.gave_up = True
                job.not_before = time.monotonic() + self.requeue_after_s
                self._queue.append(job)
                return
        if self._closed:
            self._failed(job, "S3 tier closed before the upload succeeded", will_retry=False)
        else:
            self._failed(job, f"superseded by step {superseded_by} before it reached S3", will_retry=False)

    def _upload_once(self, job: _Upload) -> int:
        """Upload every file the local marker lists, then the marker. Returns the bytes uploaded."""
        with open(os.path.join(job.local_dir, COMMIT_MARKER), "rb") as f:
            raw = f.read()
        marker = parse_marker(raw)
        files = marker.get("files")
        if files is None:  # a marker of an older hyperpod-lab: hash now, upload a full marker
            files = {}
            for name in sorted(os.listdir(job.local_dir)):
                if name != COMMIT_MARKER and not name.startswith(COMMIT_MARKER + ".tmp"):
                    size, checksum = file_checksum(os.path.join(job.local_dir, name))
                    files[name] = {"bytes": size, "checksum": checksum}
            marker["files"] = files
            raw = json.dumps(marker, sort_keys=True).encode() + b"\n"
        for rel, meta in files.items():
            size = os.path.getsize(os.path.join(job.local_dir, rel))
            if size != meta["bytes"]:
                raise S3TierError(f"local file {rel} is {size} bytes, its marker says {meta['bytes']}")
        s3 = self._client()
        s3.delete_object(Bucket=self.bucket, Key=self._key(job.step, COMMIT_MARKER))
        with self._transfer_manager() as tm:
            futures = [tm.upload(os.path.join(job.local_dir, rel), self.bucket, self._key(job.step, rel))
                       for rel in sorted(files, key=lambda r: -files[r]["bytes"])]
            for fut in futures:
                fut.result()
        # every shard is in S3: only now the marker, which makes the step complete
        s3.put_object(Bucket=self.bucket, Key=self._key(job.step, COMMIT_MARKER), Body=raw,
                      ContentType="application/json")
        return sum(meta["bytes"] for meta in files.values())

    # ---- listing, retention -------------------------------------------------------------------
    def _list_steps(self) -> dict[int, list[str]]:
        """``{step: [keys]}`` of this job's step folders in S3."""
        out: dict[int, list[str]] = {}
        paginator = self._client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.base):
            for obj in page.get("Contents", []):
                m = _STEP_KEY.match(obj["Key"][len(self.base):])
                if m:
                    out.setdefault(int(m.group(1)), []).append(obj["Key"])
        return out

    def complete_steps(self) -> list[int]:
        """Steps whose S3 commit marker exists, newest first (any rank may call; [] when the tier
        is disabled).

        Raises:
            S3TierError: S3 could not be listed (the message says why: endpoint, credentials...).
        """
        if self.error is not None:
            return []
        try:
            steps = self._list_steps()
        except Exception as e:
            raise S3TierError(f"cannot list s3://{self.bucket}/{self.base}: {self._describe(e)}") from e
        marker_of = {s: self._key(s, COMMIT_MARKER) for s in steps}
        return sorted((s for s, keys in steps.items() if marker_of[s] in keys), reverse=True)

    def _retain(self) -> None:
        """Keep the ``keep_last`` newest complete steps; delete older complete steps (marker
        first), incomplete steps older than the newest complete one (``shared``: older than the
        oldest complete step kept), and their stale multipart uploads. Runs in the upload thread
        after a successful upload."""
        s3 = self._client()
        steps = self._list_steps()
        complete = sorted((s for s, keys in steps.items() if self._key(s, COMMIT_MARKER) in keys), reverse=True)
        if not complete:
            return
        kept = complete[:max(1, self.keep_last)]
        floor = kept[-1] if self.shared else complete[0]  # incomplete steps below it are dead uploads
        doomed = [s for s in complete[max(1, self.keep_last):]]
        doomed += [s for s in steps if s not in complete and s < floor]
        for s in sorted(doomed):
            marker = self._key(s, COMMIT_MARKER)
            keys = steps[s]
            if marker in keys:  # the step stops being complete before any shard disappears
                s3.delete_object(Bucket=self.bucket, Key=marker)
            rest = [k for k in keys if k != marker]
            for i in range(0, len(rest), 1000):
                s3.delete_objects(Bucket=self.bucket,
                                  Delete={"Objects": [{"Key": k} for k in rest[i:i + 1000]], "Quiet": True})
        try:
            uploads = s3.list_multipart_uploads(Bucket=self.bucket, Prefix=self.base).get("Uploads", [])
        except Exception:
            uploads = []
        for up in uploads:
            m = _STEP_KEY.match(up["Key"][len(self.base):])
            if m and int(m.group(1)) < floor and int(m.group(1)) not in kept:
                try:
                    s3.abort_multipart_upload(Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"])
                except Exception:
                    pass

    # ---- downloading --------------------------------------------------------------------------
    def download(self, step: int, dest_dir: str, key: bytes | None = None) -> str:
        """Download every object of a complete step into ``dest_dir`` and verify it.

        The marker is fetched first (and, with ``key``, authenticated before anything else is
        downloaded) and written to ``dest_dir`` last (after every file matched its size, CRC-32
        and SHA-256), so ``dest_dir`` is a complete persistent checkpoint only if the download
        succeeded; a ``COMMITTED`` file already in ``dest_dir`` is removed first.

        Args:
            step: an S3 step (see :meth:`complete_steps`).
            dest_dir: local directory, created if needed.
            key: the job's checkpoint key: the marker's HMAC must verify under it (the restore
                always gives it). None checks integrity only (e.g. to copy a step elsewhere).

        Returns:
            ``dest_dir``.

        Raises:
            S3CheckpointCorrupt: the marker is missing, unreadable or (with ``key``) fails
                authentication, or a file is missing or does not match it (the exception's
                ``key`` attribute names the object).
            S3TierError: any other S3 failure (endpoint, credentials, bucket).
        """
        if self.error is not None:
            raise S3TierError(f"the S3 tier is disabled: {self.error}")
        step = int(step)
        marker_key = self._key(step, COMMIT_MARKER)
        marker_uri = f"s3://{self.bucket}/{marker_key}"
        s3 = self._client()
        try:
            raw = s3.get_object(Bucket=self.bucket, Key=marker_key)["Body"].read()
        except Exception as e:
            if _is_not_found(e):
                raise S3CheckpointCorrupt(marker_uri,
                                          "no commit marker (the upload of this step did not finish)") from e
            raise S3TierError(f"cannot read {marker_uri}: {self._describe(e)}") from e
        try:
            marker = parse_marker(raw)
        except ValueError as e:
            raise S3CheckpointCorrupt(marker_uri, str(e)) from e
        if key is not None:
            reason = authenticate_marker(marker, key, step)
            if reason is not None:
                raise S3CheckpointCorrupt(marker_uri, reason)
        files = marker.get("files")
        if not files:
            raise S3CheckpointCorrupt(marker_uri, "the commit marker lists no files")
        os.makedirs(dest_dir, exist_ok=True)
        try:
            os.remove(os.path.join(dest_dir, COMMIT_MARKER))
        except FileNotFoundError:
            pass
        keys = {rel: self._key(step, rel) for rel in files}
        try:
            with self._transfer_manager() as tm:
                futures = []
                for rel in sorted(files, key=lambda r: -files[r]["bytes"]):
                    assert safe_relpath(rel)  # parse_marker checked it
                    local = os.path.join(dest_dir, *rel.split("/"))
                    os.makedirs(os.path.dirname(local), exist_ok=True)
                    futures.append((rel, tm.download(self.bucket, keys[rel], local)))
                for rel, fut in futures:
                    try:
                        fut.result()
                    except Exception as e:
                        if _is_not_found(e):
                            raise S3CheckpointCorrupt(f"s3://{self.bucket}/{keys[rel]}",
                                                      "missing (the commit marker lists it)") from e
                        raise
        except S3CheckpointCorrupt:
            raise
        except Exception as e:
            raise S3TierError(f"download of {self.step_uri(step)} failed: {self._describe(e)}") from e
        for rel in files:
            reason = check_file(dest_dir, rel, files[rel])
            if reason is not None:
                raise S3CheckpointCorrupt(f"s3://{self.bucket}/{keys[rel]}", reason)
        if METADATA_FILE not in files:
            raise S3CheckpointCorrupt(marker_uri, f"the commit marker does not list {METADATA_FILE}")
        write_atomic(os.path.join(dest_dir, COMMIT_MARKER), raw)
        return dest_dir

    # ---- restoring ----------------------------------------------------------------------------
    def restore_into(self, checkpointer: LocalCheckpoints, dcp_state: dict[str, Any]) -> int | None:
        """The last link of the restore chain: load the newest complete S3 step that downloads,
        verifies and loads. Called by :meth:`Checkpointer.restore
        <hyperpod_lab.runtime.checkpoint.persistent.Checkpointer.restore>` when no local checkpoint loaded;
        collective (every rank, on the checkpointer's group).

        Rank 0 lists the complete steps and downloads each, newest first, into
        ``<checkpointer.root>/step-XXXXXXXX/`` (``shared``: into a private directory first, see
        the module docstring) (:meth:`download` with ``ctx.checkpoint_key``:
        marker authenticated first, files verified against its SHA-256s, marker written last);
        every rank then loads it. A step that fails to download or verify emits
        ``checkpoint.corrupt`` {tier: "s3", step, path: the S3 key, reason} or ``checkpoint.failed``
        {tier: "s3", step, attempt: 1, will_retry: false, reason, path}; one whose load fails emits
        ``checkpoint.corrupt`` naming its ``.metadata`` and is set aside; the next older step is
        tried. Success emits ``checkpoint.restored`` {tier: "s3", step, bytes, seconds (download
        and load), path (the step's S3 URI), local_path} on rank 0. An S3 that cannot be listed
        emits ``checkpoint.failed`` {tier: "s3", step: null} and restores nothing.

        Args:
            checkpointer: the persistent tier this one backs (its directory, its process group).
            dcp_state: :func:`hyperpod_lab.runtime.state.to_dcp` of the training state.

        Returns:
            The step restored, or None when none loaded.

        Raises:
            RuntimeError: a collective failed (a peer died).
        """
        rank0 = self.ctx.rank == 0
        steps: list[int] = []
        if rank0:
            try:
                steps = self.complete_steps()
            except Exception as e:
                self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_S3, step=None, attempt=1, will_retry=False,
                              reason=f"cannot list the S3 checkpoints to restore from: {short_error(e)}",
                              path=self.uri)
        staging = None
        if self.shared:  # every group's rank 0 may be downloading at once: a directory of our own
            staging = checkpointer.broadcast(
                os.path.join(checkpointer.root, f".s3-download-{uuid.uuid4().hex}") if rank0 else None)
        try:
            return self._restore_steps(checkpointer, dcp_state, checkpointer.broadcast(steps), staging)
        finally:
            if staging is not None and rank0:
                shutil.rmtree(staging, ignore_errors=True)

    def _restore_steps(self, checkpointer: LocalCheckpoints, dcp_state: dict[str, Any], steps: list[int],
                       staging: str | None) -> int | None:
        """Collective: :meth:`restore_into`'s loop over the S3 steps, newest first."""
        rank0 = self.ctx.rank == 0
        for step in steps:
            t0 = time.monotonic()
            final = os.path.join(checkpointer.root, step_dir_name(step))
            path = final if staging is None else os.path.join(staging, step_dir_name(step))
            failure = self._fetch(step, path) if rank0 else None
            if checkpointer.broadcast(failure) is not None:
                continue
            error = checkpointer.load_dir(dcp_state, path)  # the download verified every file
            if error is not None:  # intact, but not this state's: an error, not an older step
                raise state_mismatch(step, f"{self.step_uri(step)} (downloaded to {path})", error)
            seconds = time.monotonic() - t0
            if rank0:
                try:
                    nbytes = int(read_marker(path).get("bytes") or 0) or dir_bytes(path)
                except (OSError, ValueError):
                    nbytes = dir_bytes(path)
                if path != final:
                    _move_into_place(path, final)
                self.ctx.emit(EventKind.CHECKPOINT_RESTORED, tier=TIER_S3, step=step, bytes=nbytes, seconds=seconds,
                              path=self.step_uri(step), local_path=final)
            return step
        return None

    def _fetch(self, step: int, path: str) -> tuple[str, str, str] | None:
        """Rank 0: download ``step`` into ``path`` afresh. Returns None, or ``(what, where,
        reason)`` after emitting the failure (``path`` then removed)."""
        shutil.rmtree(path, ignore_errors=True)
        try:
            self.download(step, path, key=self.ctx.checkpoint_key)
            return None
        except S3CheckpointCorrupt as e:
            failure = ("corrupt", e.key, e.reason)
        except Exception as e:
            failure = ("failed", self.step_uri(step), short_error(e))
        shutil.rmtree(path, ignore_errors=True)
        if failure[0] == "corrupt":
            self.ctx.emit(EventKind.CHECKPOINT_CORRUPT, tier=TIER_S3, step=step, path=failure[1], reason=failure[2])
        else:
            self.ctx.emit(EventKind.CHECKPOINT_FAILED, tier=TIER_S3, step=step, attempt=1, will_retry=False,
                          reason=f"download failed: {failure[2]}", path=failure[1])
        return failure

    # ---- lifecycle ----------------------------------------------------------------------------
    def wait(self, timeout_s: float | None = None) -> None:
        """Block until every queued upload has succeeded, been superseded, or failed all
        ``max_attempts`` attempts of its current round (it then stays queued for a later
        round), or until ``timeout_s`` seconds passed. Never raises."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            while self._inflight is not None or any(not j.gave_up for j in self._queue):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return
                self._cv.wait(left)

    def close(self) -> None:
        """Stop the upload thread (called by ``ctx.finish`` after :meth:`wait`). An attempt in
        flight is not interrupted; queued uploads are abandoned with
        ``checkpoint.failed`` {will_retry: false}. Waits at most 5 s for the thread. Idempotent."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            dropped, self._queue = self._queue, []
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:  # a daemon thread: an attempt still running dies with the process
            thread.join(timeout=5.0)
        for job in dropped:
            self._failed(job, "S3 tier closed before the upload succeeded", will_retry=False)

    def __repr__(self) -> str:
        return (f"S3Tier(uri={self.uri!r}, every_steps={self.every_steps}, keep_last={self.keep_last}, "
                f"endpoint_url={self.endpoint_url!r})")


def _move_into_place(path: str, final: str) -> None:
    """Rename the downloaded step ``path`` to ``final`` unless a complete checkpoint (another
    group's download, or a save) is there already; a stale incomplete ``final`` is left alone
    (retention or a later restore removes it). ``path`` is gone afterwards either way."""
    if not os.path.exists(os.path.join(final, COMMIT_MARKER)):
        try:
            os.rename(path, final)  # atomic; fails when final is a non-empty directory
            return
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)


def _is_not_found(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str((response.get("Error") or {}).get("Code") or "")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return code in ("NoSuchKey", "404", "NotFound") or status == 404
    return False
