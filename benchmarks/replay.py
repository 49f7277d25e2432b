"""A shop's weeks, replayed: the whole loop (record, train, gate, publish, hot reload, fold-in,
trending, fresh items) measured over time on a timestamped log.

The oldest share of the log's time trains the first version (``ordrec-train run``); then, for
each arm, a real ``ordrec-serve`` with a real redis-server (append-only file synced on every
write) replays the rest in time order, a simulated day at a time, from several client threads.
Before each interaction the client asks ``Recommend`` for that user (n=10) and counts a hit when
the item about to be recorded is in the list (only relevant interactions are trials: rating >= 4
where there are ratings); then it records the interaction with ``RecordInteractions``.

Arms (each a separate run of the same replay, from the same first version):

- ``full``: the loop. Values recorded (fold-in), trending and fresh items on, the real job
  (``ordrec-train run JOB.toml``, gate on, reading the recorded events) every ``--job-every``
  simulated days, the server hot-reloading what it publishes;
- ``static``: the first version only (what a nightly export gives): no job, no trending, no
  fresh items, and nothing recorded (so nothing to fold in): the client excludes the user's
  replayed items itself, as the seen filter would; unknown users get the training popularity;
- ``popularity``: the first version's popularity list (an unknown user's answer, trending off),
  the user's training and replayed items excluded by the client; nothing recorded;
- ``trending``: ``Recommend`` with ``model: "trending"`` (time-decayed counts in Redis), the
  user's training items excluded (the server excludes the recorded ones).

The server runs in accelerated time: a trending half-life of one simulated day (``--day-seconds``
of wall time at least). Per simulated day and arm the report has the hit rate; users served by the
model, by fold-in and by a fallback; fresh items served and hits on items the first version did
not know; events acknowledged and (full loop) what the job read and what its checkpoint holds;
versions published and refused; Recommend p50/p99 and errors. Latencies are also split by phase:
quiet, while a job runs (it shares the cores), and during a reload (from a version's publish to
one second after the first reply it answers).

``--faults`` (full loop only): SIGKILL redis-server once at the start of a day (restarted on its
append-only file a second later) and the job once mid-run; calls are retried until acknowledged, and the
report says what was lost (acknowledged events missing from the final checkpoint).

    python benchmarks/replay.py --data ../shared/data/ml-100k/u.data --format ml-100k \\
        --out /tmp/replay-ml100k --plot docs/replay-ml100k.png
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from collections import defaultdict  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import redis  # noqa: E402

from ordrec.service.live.redis_state import EVENTS_STREAM  # noqa: E402
from ordrec.service.serving.server import warm_up_kernels  # noqa: E402
from ordrec.service.storage.registry import Registry  # noqa: E402
from ordrec.tools.process import RedisServer, ServerProcess  # noqa: E402
from ordrec.trainer.events import load_checkpoint  # noqa: E402
from ordrec.v1 import recommender_pb2 as pb  # noqa: E402
from ordrec.v1 import recommender_pb2_grpc  # noqa: E402

MODEL = "dcr"
N = 10
ARMS = ("full", "static", "popularity", "trending")
ANONYMOUS = "replay-anonymous-visitor"  # never recorded: the popularity arm's unknown user
LIKED = 4.0  # explicit ratings: an interaction is a trial when its rating is at least this
RECORD_DEADLINE = 60.0  # seconds a RecordInteractions is retried (Redis down) before it counts lost
RELOAD_TAIL = 1.0  # seconds after a version's first reply still counted as its reload
JOB_LINE = re.compile(r"result=(published|rejected) .*?version=(\S+)")
EVENTS_LINE = re.compile(r" events since=.* read=(\d+) accumulated=(\d+) trained=(\d+)")
VERSION_FORMAT = "%Y%m%dT%H%M%S.%fZ"


# ------------------------------------------------------------------ the log


@dataclass(frozen=True)
class Event:
    user: str
    item: str
    value: float | None  # the rating; None for an implicit interaction
    time: float  # seconds (ML-100K) or months (Last.fm): the log's own clock


@dataclass
class Log:
    train: list[Event]
    days: list[list[Event]]  # the replayed part, one list per simulated day (in time order)
    implicit: bool


def read_ml100k(path: Path) -> tuple[list[Event], float]:
    """``user item rating timestamp`` lines; a simulated day is a day."""
    rows = np.loadtxt(path, dtype=np.int64, ndmin=2)
    events = [Event(str(u), str(i), float(r), float(t)) for u, i, r, t in rows[:, :4]]
    return events, 86400.0


def read_lastfm_tags(path: Path) -> tuple[list[Event], float]:
    """Who tagged which artist, at month resolution (``user_taggedartists.dat``): each (user, artist)
    once, at its first month; the few rows dated before 2005 dropped. A simulated day is a month."""
    first: dict[tuple[str, str], float] = {}
    with open(path, encoding="latin-1") as lines:
        next(lines)  # header
        for line in lines:
            user, artist, _tag, _day, month, year = line.split()
            if int(year) < 2005:
                continue
            when = float(int(year) * 12 + int(month) - 1)
            key = (user, artist)
            first[key] = min(when, first.get(key, when))
    return [Event(u, a, None, t) for (u, a), t in first.items()], 1.0


READERS = {"ml-100k": read_ml100k, "lastfm-tags": read_lastfm_tags}


def in_share(user: str, share: float) -> bool:
    """A stable, seeded choice of users (``--user-share``)."""
    return share >= 1.0 or zlib.crc32(user.encode()) / 2**32 < share


def split_log(events: list[Event], day: float, train_share: float, user_share: float, max_days: int) -> list:
    """The oldest ``train_share`` of the log's time span trains; the rest is cut into days."""
    ordered = sorted(events, key=lambda e: e.time)  # stable: ties keep the file's order
    first, last = ordered[0].time, ordered[-1].time
    cut = first + train_share * (last - first)
    train = [e for e in ordered if e.time < cut]
    days: list[list[Event]] = [[] for _ in range(int((last - cut) // day) + 1)]
    for e in ordered:
        if e.time >= cut and in_share(e.user, user_share):
            days[int((e.time - cut) // day)].append(e)
    return train, days[:max_days] if max_days else days


def load_log(path: Path, fmt: str, train_share: float, user_share: float, max_days: int) -> Log:
    events, day = READERS[fmt](path)
    train, days = split_log(events, day, train_share, user_share, max_days)
    return Log(train=train, days=days, implicit=fmt == "lastfm-tags")


def relevant(event: Event) -> bool:
    return event.value is None or event.value >= LIKED


# ------------------------------------------------------------------ the job


def write_training_file(log: Log, folder: Path) -> Path:
    """The training part in a reader format: ml-100k lines, or a user,item,timestamp csv (implicit)."""
    if log.implicit:
        path = folder / "train.csv"
        lines = ["user,item,timestamp"] + [f"{e.user},{e.item},{e.time:.0f}" for e in log.train]
    else:
        path = folder / "train.data"
        lines = [f"{e.user}\t{e.item}\t{e.value:.0f}\t{e.time:.0f}" for e in log.train]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_job(folder: Path, data: Path, registry: Path, log: Log, options, redis_url: str = "") -> Path:
    """The cron job: one DCR on the training part plus the recorded events, gate on (its metric
    within ``--gate-margin`` of the live version's, and the popularity floor). Implicit data's
    default metric is hit_rate_at_10: ndcg_at_10 needs two values among a user's held-out items."""
    metric = options.gate_metric or ("hit_rate_at_10" if log.implicit else "ndcg_at_10")
    events = f'\n[events]\nredis = "{redis_url}"\ntimeout = 10\n' if redis_url else ""
    feedback = '\nfeedback = "implicit"' if log.implicit else '\nformat = "ml-100k"'
    path = folder / ("job.toml" if redis_url else "first-job.toml")
    path.write_text(
        f'[job]\nname = "replay"\nregistry = "{registry}"\n{events}\n'
        f'[data.ratings]\npath = "{data}"{feedback}\n\n'
        f'[[models]]\nname = "{MODEL}"\nkind = "dcr"\ndata = "ratings"\nparams = {{ {options.params} }}\n'
        f'gate = {{ metric = "{metric}", margin = {options.gate_margin} }}\n'
    )
    return path


@dataclass
class JobRun:
    day: int
    started: float
    ended: float = 0.0
    exit_code: int | None = None
    outcome: str = "running"  # published, rejected, failed, killed
    version: str = ""
    events_read: int = 0
    events_accumulated: int = 0
    acknowledged_before: int = 0  # distinct events acknowledged when the job started


class JobRunner:
    """Runs ``ordrec-train run JOB.toml`` in the background, one at a time."""

    def __init__(self, job: Path, log_path: Path, cpus: set[int] | None = None):
        self.job, self.log_path, self.cpus = job, log_path, cpus
        self.runs: list[JobRun] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def start(self, day: int, acknowledged: int) -> JobRun:
        self.wait()
        run = JobRun(day=day, started=time.time(), acknowledged_before=acknowledged)
        self.runs.append(run)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ordrec.trainer", "run", str(self.job)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None,
        )
        self.thread = threading.Thread(target=self._follow, args=(self.proc, run), daemon=True)
        self.thread.start()
        return run

    def _follow(self, proc: subprocess.Popen, run: JobRun) -> None:
        output, _ = proc.communicate()
        run.ended, run.exit_code = time.time(), proc.returncode
        with open(self.log_path, "a") as sink:
            sink.write(output)
        result, events = JOB_LINE.search(output), EVENTS_LINE.search(output)
        if events:
            run.events_read, run.events_accumulated = int(events.group(1)), int(events.group(2))
        if result:
            run.outcome, run.version = result.group(1), result.group(2)
        else:
            run.outcome = "killed" if proc.returncode and proc.returncode < 0 else "failed"

    def kill(self) -> None:
        """SIGKILL the running job (the fault variant)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()


def run_first_job(folder: Path, log: Log, options) -> Path:
    """Train and publish the first version into ``folder/registry`` (every arm starts from a copy)."""
    data = write_training_file(log, folder)
    job = write_job(folder, data, folder / "registry", log, options)
    result = subprocess.run(
        [sys.executable, "-m", "ordrec.trainer", "run", str(job)], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise SystemExit(f"the first job failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return data


# ------------------------------------------------------------------ one arm


@dataclass
class Day:
    """One simulated day of one arm."""

    events: int = 0
    trials: int = 0
    hits: int = 0
    new_item_trials: int = 0
    new_item_hits: int = 0
    served: dict = field(default_factory=lambda: {"model": 0, "fold_in": 0, "fallback": 0})
    trials_by_source: dict = field(default_factory=lambda: defaultdict(int))  # trials by who answered
    hits_by_source: dict = field(default_factory=lambda: defaultdict(int))
    fresh_items: set = field(default_factory=set)
    latencies: list = field(default_factory=list)  # (wall start, seconds) of each Recommend
    errors: dict = field(default_factory=lambda: defaultdict(int))
    failed_recommends: list = field(default_factory=list)  # wall start of each failed Recommend
    faults: list = field(default_factory=list)  # what --faults killed that day
    record_retries: int = 0
    versions: set = field(default_factory=set)


@dataclass(frozen=True)
class ArmSettings:
    name: str
    records: bool  # False: the client excludes the user's replayed items itself (nothing to fold in)
    serve_flags: tuple[str, ...]  # beside --redis


def arm_settings(name: str, day_seconds: float) -> ArmSettings:
    accelerated = ("--trending-half-life", str(day_seconds), "--trending-window", str(7 * day_seconds))
    without_live = ("--trending", "", "--fresh-interval", "0")
    return {
        "full": ArmSettings("full", True, accelerated),
        "static": ArmSettings("static", False, without_live),
        "popularity": ArmSettings("popularity", False, without_live),
        "trending": ArmSettings("trending", True, accelerated),
    }[name]


class Client:
    """One arm's calls: the question asked before each interaction, and the recording."""

    def __init__(self, stub, arm: ArmSettings, trained: dict[str, set[str]]):
        self.stub, self.arm = stub, arm
        self.trained = trained  # each user's training items
        self.replayed: dict[str, set[str]] = defaultdict(set)  # arms that do not record: what was replayed
        self.acknowledged: set[tuple[str, str]] = set()
        self.lock = threading.Lock()

    def request(self, user: str) -> pb.RecommendRequest:
        """The full loop's question is the plain one: the server's seen filter excludes the user's
        items. The others exclude what the server cannot know (see the module's docstring)."""
        trained, replayed = self.trained.get(user, set()), self.replayed.get(user, set())
        if self.arm.name == "popularity":
            return pb.RecommendRequest(
                model=MODEL, user_ids=[ANONYMOUS], n=N, exclude_item_ids=trained | replayed
            )
        if self.arm.name == "trending":
            return pb.RecommendRequest(model="trending", user_ids=[user], n=N, exclude_item_ids=trained)
        return pb.RecommendRequest(model=MODEL, user_ids=[user], n=N, exclude_item_ids=replayed)

    def recommend(self, user: str, day: Day) -> UserAnswer | None:
        started = time.time()
        clock = time.perf_counter()
        try:
            reply = self.stub.Recommend(self.request(user), timeout=10)
        except grpc.RpcError as exc:
            day.errors[f"Recommend {exc.code().name}"] += 1
            day.failed_recommends.append(started)
            return None
        finally:
            day.latencies.append((started, time.perf_counter() - clock))
        return UserAnswer.of(reply)

    def record(self, event: Event, day: Day) -> None:
        """RecordInteractions: a rating with its value, an implicit interaction as a pick (no
        value). Retried while UNAVAILABLE (Redis down: the outcome is unknown, a repeat is harmless)."""
        if not self.arm.records:
            with self.lock:
                self.replayed[event.user].add(event.item)
            return
        picked = event.value is None
        request = pb.RecordInteractionsRequest(
            user_id=event.user,
            model=MODEL,
            item_ids=[event.item] if picked else [],
            interactions=[] if picked else [pb.Interaction(item_id=event.item, value=event.value)],
        )
        deadline = time.monotonic() + RECORD_DEADLINE
        while True:
            try:
                self.stub.RecordInteractions(request, timeout=10)
                break
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    day.errors[f"RecordInteractions {exc.code().name}"] += 1
                    return
                day.record_retries += 1
                time.sleep(0.05)
        with self.lock:
            self.acknowledged.add((event.user, event.item))


@dataclass
class UserAnswer:
    items: list[str]
    fresh: set[str]
    source: str  # model, fold_in or fallback
    version: str

    @classmethod
    def of(cls, reply: pb.RecommendResponse) -> UserAnswer:
        (result,) = reply.results
        source = (
            "fold_in" if result.folded_in else "model" if result.fallback == pb.FALLBACK_NONE else "fallback"
        )
        if reply.model == "trending":
            source = "fallback"
        return cls(
            items=[s.id for s in result.items],
            fresh={s.id for s in result.items if s.fresh},
            source=source,
            version=result.model_version or reply.model_version,
        )


class Arm:
    """One arm's run: its redis-server, its server, its client threads and (full loop) its jobs."""

    def __init__(self, settings: ArmSettings, log: Log, base: Path, folder: Path, options):
        self.settings, self.log, self.options = settings, log, options
        self.folder = folder
        shutil.copytree(base / "registry", folder / "registry")
        self.registry = folder / "registry"
        self.trained_items = {e.item for e in log.train}
        trained: dict[str, set[str]] = defaultdict(set)
        for e in log.train:
            trained[e.user].add(e.item)
        self.trained_by_user = dict(trained)  # each user's training items
        self.days = [Day() for _ in log.days]
        self.first_reply: dict[str, float] = {}  # version -> wall time of its first reply
        self.faults: dict[str, int] = {}  # what was killed (--faults) -> on which day

    def run(self, data: Path) -> dict:
        (self.folder / "aof").mkdir()
        redis_server = RedisServer(aof_dir=self.folder / "aof").start()
        jobs = None
        if self.settings.name == "full":
            job = write_job(self.folder, data, self.registry, self.log, self.options, redis_server.url)
            jobs = JobRunner(job, self.folder / "jobs.log", self.options.job_cpus)
        flags = ("--redis", redis_server.url, "--redis-timeout", "1", "--poll-interval", "1")
        if self.options.server_cpu is not None:  # the server on its own core, as on its own machine
            flags += ("--cpu", str(self.options.server_cpu))
        try:
            with (
                ServerProcess(
                    self.registry, *flags, *self.settings.serve_flags, log_path=self.folder / "serve.log"
                ) as server,
                grpc.insecure_channel(server.target) as channel,
            ):
                client = Client(
                    recommender_pb2_grpc.RecommenderStub(channel), self.settings, self.trained_by_user
                )
                self.replay(client, jobs, redis_server)
                if jobs is not None:  # the last days' events: one more run, then compare
                    jobs.start(len(self.days), len(client.acknowledged))
                    jobs.wait()
            stream = stream_pairs(redis_server.url)
        finally:
            redis_server.stop()
        return self.summary(client, jobs, stream)

    def replay(self, client: Client, jobs: JobRunner | None, redis_server: RedisServer) -> None:
        """Each simulated day: its interactions from the client threads, then (full loop) the job."""
        options = self.options
        with ThreadPoolExecutor(options.threads) as pool:
            for number, events in enumerate(self.log.days):
                started = time.monotonic()
                if self.fault_due("redis", number, jobs):
                    self.kill_redis(redis_server, self.days[number])
                lanes: list[list[Event]] = [[] for _ in range(options.threads)]
                for e in events:  # each user's interactions stay in order, on one thread
                    lanes[zlib.crc32(e.user.encode()) % options.threads].append(e)
                list(pool.map(partial(self.play, client, day=self.days[number]), lanes))
                time.sleep(max(0.0, options.day_seconds - (time.monotonic() - started)))
                if jobs is not None and (number + 1) % options.job_every == 0:
                    jobs.start(number, len(client.acknowledged))
                    if self.fault_due("job", number, jobs):
                        self.days[number].faults.append("job killed")
                        threading.Timer(self.kill_job_after(jobs), jobs.kill).start()

    def fault_due(self, what: str, number: int, jobs: JobRunner | None) -> bool:
        """``--faults``: Redis dies at the start of the day a third of the way in, the first job
        started from two thirds of the way on dies mid-run; each once."""
        if not self.options.faults or jobs is None or what in self.faults:
            return False
        due = number == len(self.days) // 3 if what == "redis" else number >= 2 * len(self.days) // 3
        if due:
            self.faults[what] = number
        return due

    def kill_job_after(self, jobs: JobRunner) -> float:
        """``--kill-job-after``, or half the last finished run's duration: mid-run on this machine."""
        finished = [r.ended - r.started for r in jobs.runs if r.ended]
        return self.options.kill_job_after or (finished[-1] / 2 if finished else 1.0)

    def kill_redis(self, server: RedisServer, day: Day) -> None:
        """SIGKILL redis-server; a second later it restarts on its append-only file."""
        server.kill()
        day.faults.append("redis-server killed for 1 s")
        threading.Timer(1.0, server.start).start()

    def play(self, client: Client, events: list[Event], day: Day) -> None:
        for e in events:
            answer = client.recommend(e.user, day)
            day.events += 1
            if answer is not None:
                self.count(e, answer, day)
            client.record(e, day)

    def count(self, e: Event, answer: UserAnswer, day: Day) -> None:
        day.served[answer.source] += 1
        day.fresh_items.update(answer.fresh)
        day.versions.add(answer.version)
        self.first_reply.setdefault(answer.version, time.time())
        if relevant(e):
            hit = e.item in answer.items
            day.trials += 1
            day.hits += hit
            day.trials_by_source[answer.source] += 1
            day.hits_by_source[answer.source] += hit
            if e.item not in self.trained_items:
                day.new_item_trials += 1
                day.new_item_hits += hit

    # -------------------------------------------------------------- the report

    def reload_windows(self, jobs: JobRunner | None) -> list[tuple[float, float]]:
        """From each published version's publish time to a second after its first reply."""
        windows = []
        for run in jobs.runs if jobs else []:
            if run.outcome == "published":
                published = datetime.strptime(run.version, VERSION_FORMAT).replace(tzinfo=timezone.utc)
                first = self.first_reply.get(run.version, run.ended + 10.0)
                windows.append((published.timestamp(), first + RELOAD_TAIL))
        return windows

    def summary(self, client: Client, jobs: JobRunner | None, stream: set[tuple[str, str]]) -> dict:
        reloads = self.reload_windows(jobs)
        job_windows = [(r.started, r.ended) for r in jobs.runs] if jobs else []
        rows = [self.day_row(n, day, reloads, job_windows, jobs) for n, day in enumerate(self.days)]
        phases = phase_latencies([lat for day in self.days for lat in day.latencies], reloads, job_windows)
        trained = self.trained_events(jobs)
        last_read = jobs.runs[-1].events_accumulated if jobs else None
        return {
            "arm": self.settings.name,
            "days": rows,
            "trials": sum(d.trials for d in self.days),
            "hits": sum(d.hits for d in self.days),
            "hit_rate": ratio(sum(d.hits for d in self.days), sum(d.trials for d in self.days)),
            "by_source": self.by_source(),
            "acknowledged": len(client.acknowledged),
            "in_stream": len(stream),
            "acknowledged_lost": len(client.acknowledged - stream),
            "read_by_last_job": last_read,
            "trained_events": None if trained is None else len(trained),
            "jobs": [vars(r) for r in jobs.runs] if jobs else [],
            "published": sum(r.outcome == "published" for r in jobs.runs) if jobs else 0,
            "refused": sum(r.outcome == "rejected" for r in jobs.runs) if jobs else 0,
            "latency_ms": phases,
            "recommend_errors": sum(
                v for d in self.days for k, v in d.errors.items() if k.startswith("Recommend")
            ),
            "recommend_errors_in_reload": sum(
                inside(t, reloads) for d in self.days for t in d.failed_recommends
            ),
            "record_retries": sum(d.record_retries for d in self.days),
            "faults": self.faults,
        }

    def by_source(self) -> dict:
        """Trials, hits and hit rate by who answered: the model, fold-in or a fallback."""
        totals = {}
        for source in ("model", "fold_in", "fallback"):
            trials = sum(d.trials_by_source.get(source, 0) for d in self.days)
            hits = sum(d.hits_by_source.get(source, 0) for d in self.days)
            totals[source] = {"trials": trials, "hits": hits, "hit_rate": ratio(hits, trials)}
        return totals

    def trained_events(self, jobs: JobRunner | None) -> set[tuple[str, str]] | None:
        """The (user, item) pairs of the recorded events the live version was trained on."""
        if jobs is None:
            return None
        return set(load_checkpoint(Registry(self.registry), MODEL).latest)

    def day_row(self, number: int, day: Day, reloads, job_windows, jobs: JobRunner | None) -> dict:
        runs = [r for r in jobs.runs if r.day == number] if jobs else []
        quiet = [s for t, s in day.latencies if not inside(t, reloads) and not inside(t, job_windows)]
        during_reload = [s for t, s in day.latencies if inside(t, reloads)]
        return {
            "day": number,
            "events": day.events,
            "trials": day.trials,
            "hits": day.hits,
            "hit_rate": ratio(day.hits, day.trials),
            "new_item_trials": day.new_item_trials,
            "new_item_hits": day.new_item_hits,
            "served": day.served,
            "trials_by_source": dict(day.trials_by_source),
            "hits_by_source": dict(day.hits_by_source),
            "fresh_items_served": len(day.fresh_items),
            "versions": sorted(day.versions),
            "job": [
                {
                    k: vars(r)[k]
                    for k in (
                        "outcome",
                        "version",
                        "events_read",
                        "events_accumulated",
                        "acknowledged_before",
                    )
                }
                for r in runs
            ],
            "p50_ms": percentile([s for _, s in day.latencies], 50),
            "p99_ms": percentile([s for _, s in day.latencies], 99),
            "quiet_p99_ms": percentile(quiet, 99),
            "reload_p99_ms": percentile(during_reload, 99),
            "reload_calls": len(during_reload),
            "errors": dict(day.errors),
            "record_retries": day.record_retries,
            "faults": day.faults,
        }


def stream_pairs(url: str) -> set[tuple[str, str]]:
    """The distinct (user, item) pairs of every entry in the events stream (what a job can read)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    pairs, start = set(), "-"
    while entries := client.xrange(EVENTS_STREAM, min=start, count=10_000):
        pairs.update((fields["user"], fields["item"]) for _, fields in entries)
        start = "(" + entries[-1][0]
    return pairs


def inside(moment: float, windows: list[tuple[float, float]]) -> bool:
    return any(start <= moment <= end for start, end in windows)


def ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def percentile(seconds: list[float], q: float) -> float | None:
    return round(float(np.percentile(seconds, q)) * 1000, 2) if seconds else None


def phase_latencies(latencies: list, reloads: list, job_windows: list) -> dict:
    """Recommend p50/p99 (ms) in each phase: quiet, while a job runs (outside reloads), in a reload,
    and outside reloads altogether."""
    phases: dict[str, list[float]] = {"quiet": [], "job_running": [], "reload": []}
    for moment, seconds in latencies:
        phase = (
            "reload" if inside(moment, reloads) else "job_running" if inside(moment, job_windows) else "quiet"
        )
        phases[phase].append(seconds)
    phases["outside_reload"] = phases["quiet"] + phases["job_running"]  # the target compares these two
    return {
        name: {"calls": len(s), "p50": percentile(s, 50), "p99": percentile(s, 99)}
        for name, s in phases.items()
    }


# ------------------------------------------------------------------ output


def fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_table(results: list[dict]) -> None:
    """One line per simulated day: each arm's hit rate, then the full loop's details."""
    by_arm = {r["arm"]: r for r in results}
    full = by_arm.get("full")
    arms = [r["arm"] for r in results]
    print(
        "day  " + "  ".join(f"{a:>10}" for a in arms) + "  trials  model/fold-in/fallback  fresh  new-hits"
        "  acked  job  p50/p99 ms"
    )
    for number in range(len(results[0]["days"])):
        rates = "  ".join(f"{fmt(by_arm[a]['days'][number]['hit_rate']):>10}" for a in arms)
        row = (full or results[0])["days"][number]
        served = row["served"]
        jobs = ",".join(f"{j['outcome']}" for j in row["job"]) or "-"
        print(
            f"{number:>3}  {rates}  {row['trials']:>6}  {served['model']:>5}/{served['fold_in']}/{served['fallback']}"
            f"  {row['fresh_items_served']:>5}  {row['new_item_hits']:>4}/{row['new_item_trials']:<4}"
            f"  {row['events']:>5}  {jobs}  {fmt(row['p50_ms'], 1)}/{fmt(row['p99_ms'], 1)}"
            + "".join(f"  [{fault}]" for fault in row["faults"])
        )
    print()
    for r in results:
        lat = r["latency_ms"]
        print(
            f"{r['arm']:>10}: hit rate {fmt(r['hit_rate'], 4)} ({r['hits']}/{r['trials']}; "
            + ", ".join(f"{s} {fmt(v['hit_rate'], 3)} of {v['trials']}" for s, v in r["by_source"].items())
            + "); acknowledged"
            f" {r['acknowledged']}, in the stream {r['in_stream']} (lost {r['acknowledged_lost']}), read by the last"
            f" job {fmt(r['read_by_last_job'])}, in the live version's checkpoint {fmt(r['trained_events'])};"
            f" published {r['published']}, refused {r['refused']}; Recommend errors {r['recommend_errors']}"
            f" ({r['recommend_errors_in_reload']} in reloads), record retries {r['record_retries']};"
            f" p50/p99 ms quiet {fmt(lat['quiet']['p50'], 1)}/{fmt(lat['quiet']['p99'], 1)},"
            f" job running {fmt(lat['job_running']['p50'], 1)}/{fmt(lat['job_running']['p99'], 1)},"
            f" reload {fmt(lat['reload']['p50'], 1)}/{fmt(lat['reload']['p99'], 1)} ({lat['reload']['calls']} calls),"
            f" outside reloads {fmt(lat['outside_reload']['p50'], 1)}/{fmt(lat['outside_reload']['p99'], 1)}"
        )


def rolling_hit_rate(days: list[dict], window: int) -> list[float | None]:
    """Each day's hit rate over the trailing ``window`` days (hits over trials: a quiet day with
    a handful of trials weighs what it holds, not a whole day's share)."""
    rates = []
    for n in range(len(days)):
        span = days[max(0, n - window + 1) : n + 1]
        rates.append(ratio(sum(d["hits"] for d in span), sum(d["trials"] for d in span)))
    return rates


def plot(results: list[dict], path: Path, title: str, window: int) -> None:
    """Hit rate over the trailing ``window`` simulated days per arm; the full loop's publishes
    as vertical lines (at the first day the new version could answer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for r in results:
        rates = rolling_hit_rate(r["days"], window)
        axes.plot(
            [d["day"] for d in r["days"]], [np.nan if x is None else x for x in rates], label=r["arm"], lw=1.4
        )
    for r in results:
        reloads = [
            j["day"] + 1 for j in r["jobs"] if j["outcome"] == "published" and j["day"] + 1 < len(r["days"])
        ]
        for n, day in enumerate(reloads):
            axes.axvline(day, color="grey", lw=0.5, ls=":", label="new version published" if n == 0 else None)
    axes.set_xlabel("simulated day of the replay")
    axes.set_ylabel(f"hit rate@{N}, trailing {window} days")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.legend(loc="lower right", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


# ------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="the timestamped log")
    parser.add_argument("--format", choices=sorted(READERS), default="ml-100k")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument(
        "--train-share", type=float, default=0.5, help="share of the log's time span trained on"
    )
    parser.add_argument(
        "--user-share", type=float, default=1.0, help="replay only this share of users (crc32)"
    )
    parser.add_argument("--max-days", type=int, default=0, help="replay only the first days (0: all)")
    parser.add_argument(
        "--day-seconds", type=float, default=2.0, help="wall seconds a simulated day lasts at least"
    )
    parser.add_argument("--job-every", type=int, default=1, help="simulated days between two runs of the job")
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    parser.add_argument(
        "--params",
        default="n_components = 10, max_iter = 10, random_state = 0",
        help="the DCR's params in the job (TOML inline table body)",
    )
    parser.add_argument(
        "--gate-metric", help="the job's gate metric (default: ndcg_at_10, implicit hit_rate_at_10)"
    )
    parser.add_argument("--gate-margin", type=float, default=0.01, help="the job's gate margin")
    parser.add_argument(
        "--faults", action="store_true", help="full loop: kill redis-server and the job once each"
    )
    parser.add_argument(
        "--kill-job-after",
        type=float,
        default=0.0,
        help="seconds into the killed job's run (0: half the last run's)",
    )
    parser.add_argument(
        "--job-cpus",
        type=lambda text: {int(c) for c in text.split(",")},
        help="CPUs the job runs on (e.g. 1), as if on its own machine; with --server-cpu the two"
        " stop sharing cores (default: both anywhere)",
    )
    parser.add_argument("--server-cpu", type=int, help="the CPU ordrec-serve is pinned to (its --cpu)")
    parser.add_argument("--out", type=Path, required=True, help="folder for replay.json, logs and registries")
    parser.add_argument("--plot", type=Path, help="PNG of the hit rate per day per arm")
    parser.add_argument(
        "--plot-window", type=int, default=7, help="simulated days each plotted hit rate covers"
    )
    return parser.parse_args(argv)


def main(argv=None) -> list[dict]:
    options = parse_args(argv)
    arms = [a for a in options.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    log = load_log(options.data, options.format, options.train_share, options.user_share, options.max_days)
    options.out.mkdir(parents=True, exist_ok=True)
    base = options.out / "first"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    print(
        f"{options.data.name}: {len(log.train)} events trained on, {sum(map(len, log.days))} replayed over"
        f" {len(log.days)} simulated days",
        flush=True,
    )
    data = run_first_job(base, log, options)
    warm_up_kernels()  # fill numba's cache once, or each server compiles its kernels before it listens
    results = []
    for name in arms:
        folder = options.out / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        started = time.monotonic()
        results.append(Arm(arm_settings(name, options.day_seconds), log, base, folder, options).run(data))
        print(
            f"arm {name}: {time.monotonic() - started:.0f} s, hit rate {fmt(results[-1]['hit_rate'], 4)}",
            flush=True,
        )
    report = {"command": sys.argv, "options": {k: str(v) for k, v in vars(options).items()}, "arms": results}
    (options.out / "replay.json").write_text(json.dumps(report, indent=1, default=sorted))
    print_table(results)
    if options.plot:
        title = f"{options.data.name}: {len(log.days)} simulated days replayed"
        plot(results, options.plot, title, options.plot_window)
    return results


if __name__ == "__main__":
    main()
