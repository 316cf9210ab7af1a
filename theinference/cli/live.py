"""What `test` shows while it works: a live line per case on stderr, the report on stdout stage by stage.

The header is printed before any student code runs, each stage's verdict as soon as its cases are
compared, and the fingerprint's finding after every verdict (matching a failure against known bugs
never delays one). On a terminal the case line is a status line updated every second; elsewhere
(CI logs, pipes) a plain line once a case has run a while, so a log keeps moving.
"""

import threading
import time

from rich.console import Console
from rich.markup import escape

from theinference.cli import early
from theinference.cli.common import OracleProgress
from theinference.grading.judge.events import (
    CallStarted,
    CaseEnded,
    CaseStarted,
    Event,
    OracleComputed,
    OracleComputing,
    RunDone,
    RunStarted,
    StageGraded,
    StageMatched,
)
from theinference.grading.judge.results import RunResult, StageResult
from theinference.grading.spec.stages import StageSpec
from theinference.report.terminal import render_finding, render_footer, render_header, render_stage


class RunProgress(OracleProgress):
    """The one status line on stderr: the case the student's code is running, or the oracle output being computed.

    Told by the runner (case) and by the oracle cache (start/finish), it keeps one status on a terminal so
    the two never draw over each other.
    """

    TICK = 0.25  # seconds between redraws of the status
    PLAIN_AFTER, PLAIN_EVERY = 2.0, 30.0  # off a terminal: a line once a case has run this long, then this often

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.case: tuple[str, int, int, str] | None = None  # adapter, case number, cases, case name
        self.case_began = 0.0
        self.detail = ""  # the running call of a case the grader drives call by call
        self.case_said = 0.0  # off a terminal: when the running case was last reported
        self.oracle: str | None = None
        self.stopped = threading.Event()
        self.ticker: threading.Thread | None = None

    def __call__(self, event: Event) -> None:
        """A listener of the run (judge/events.py): the case or call the student's code runs, the oracle output
        being computed; the other events are the report's."""
        match event:
            case CaseStarted(stage=stage, index=index) | CallStarted(stage=stage, index=index):
                call = event.call if isinstance(event, CallStarted) else ""
                self._case(stage, index, call)  # the seconds shown count from the case's start, or the call's
            case CaseEnded():
                self._case(None, 0, "")
            case OracleComputing(label=label):
                self.start(label)
            case OracleComputed(label=label):
                self.finish(label)

    def _case(self, stage: StageSpec | None, index: int, call: str) -> None:
        with self.lock:
            if stage is None:
                self.case = None
            else:
                self.case = (stage.adapter, index + 1, len(stage.cases), stage.cases[index].name)
                self.detail = call
                self.case_began = time.monotonic()
                self.case_said = 0.0
        self._ensure_ticker()

    def start(self, label: str) -> None:
        with self.lock:
            self.began, self.oracle = time.monotonic(), label
        self._ensure_ticker()

    def finish(self, label: str) -> None:
        with self.lock:
            self.oracle = None
            self.count += 1
            self.unsaid = [self.unsaid[0] + 1, self.unsaid[1] + time.monotonic() - self.began]
            if not self.live and self.unsaid[1] >= self.DELAY:  # about a line per DELAY seconds of computing
                count, spent = self.unsaid
                text = (
                    f"{label} in {spent:.1f} s" if count == 1 else f"{count} outputs in {spent:.1f} s, the last {label}"
                )
                self.console.print(f"oracle: computed {text}", markup=False, highlight=False, soft_wrap=True)
                self.unsaid = [0, 0.0]

    def pause(self) -> None:
        """Take the status line off the terminal while the report prints (it comes back at the next tick)."""
        with self.lock:
            self._stop_status()

    def close(self) -> None:
        """Stop redrawing and take the status line away."""
        self.stopped.set()
        if self.ticker is not None:
            self.ticker.join()
        with self.lock:
            self._stop_status()

    def _ensure_ticker(self) -> None:
        if self.ticker is None and not self.stopped.is_set():
            self.ticker = threading.Thread(target=self._tick, daemon=True, name="theinference-progress")
            self.ticker.start()

    def _text(self, now: float) -> str | None:
        if self.oracle is not None and now - self.began >= self.DELAY:
            return f"oracle: computing {self.oracle} ({self.count} done)"
        if self.case is not None:
            adapter, number, total, name = self.case
            call = f", {self.detail}" if self.detail else ""
            return f"running {adapter}: case {number} of {total} ({name}){call} · {now - self.case_began:.0f} s"
        return None

    def _tick(self) -> None:
        while not self.stopped.wait(self.TICK):
            with self.lock:
                now = time.monotonic()
                text = self._text(now)
                if self.live:
                    self._show_status(text)
                elif self.case is not None and text and self.oracle is None:
                    ran = now - self.case_began
                    if ran >= self.PLAIN_AFTER and (not self.case_said or now - self.case_said >= self.PLAIN_EVERY):
                        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
                        self.case_said = now

    def _show_status(self, text: str | None) -> None:
        if text is None:
            self._stop_status()
        elif self.status is None:
            self.status = self.console.status(escape(text))
            self.status.start()
        else:
            self.status.update(escape(text))

    def _stop_status(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


class StreamedReport:
    """The terminal report printed piece by piece as the run produces it (what render_run prints at once)."""

    def __init__(self, console: Console, version: str, progress: RunProgress, n_vocab: int):
        self.console, self.version, self.progress, self.n_vocab = console, version, progress, n_vocab
        self.seen: dict = {}  # errors already shown in this run
        self.shown: dict[str, StageResult] = {}  # each stage as its verdict printed it: its hints are on screen

    def __call__(self, event: Event) -> None:
        """A listener of the run (judge/events.py): the header, each verdict, each finding, then the footer."""
        match event:
            case RunStarted(run=run):
                self.header(run)
            case StageGraded(result=result):
                self.stage(result)
            case StageMatched(result=result):
                self.finding(result)
            case RunDone(run=run):
                self.footer(run)

    def header(self, run: RunResult) -> None:
        self.progress.pause()
        render_header(self.console, run, self.version, headline_shown=early.shown == run.course)
        self.console.file.flush()

    def stage(self, stage: StageResult) -> None:
        self.progress.pause()
        render_stage(self.console, stage, self.n_vocab, self.seen)
        self.shown[stage.id] = stage
        self.console.file.flush()

    def finding(self, stage: StageResult) -> None:
        self.progress.pause()
        render_finding(self.console, stage, self.shown.get(stage.id))
        self.console.file.flush()

    def footer(self, run: RunResult) -> None:
        self.progress.close()
        render_footer(self.console, run)
        self.console.file.flush()
