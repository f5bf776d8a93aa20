"""The live terminal summary of ``torchlens run``: draws a ``RunView``, computes nothing.

On a terminal the block is redrawn in place about once a second (ANSI: move
the cursor up over the last block, clear to the end of the screen), so a long
run is one screenful, not a log flood. Piped to a file or CI log, one line
(the verdict and the step times) every ``LOG_EVERY_S`` seconds.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from typing import Any, TextIO, TypeVar

from torchlens.analysis.ranks.slow import WINDOW
from torchlens.analysis.ranks.verdict import RankRow, RankStatus, RunView
from torchlens.model.units import MISSING, format_bytes, format_ms
from torchlens.render.findings import finding_text

REDRAW_S = 1.0
LOG_EVERY_S = 10.0
COST_FACTOR = 4
#: the log line lists each rank's step time up to this many ranks
LOG_RANKS = 16
_UP = "\x1b[{n}F"  # cursor to the start of the line n lines up
_CLEAR = "\x1b[J"
Row = TypeVar("Row")


def restart_line(number: Any, words: str) -> str:
    """A restart as the terminal, the watch status and the manifest's reader see it."""
    return f"restart {number}: {words}"


def shows_modelled(row: RankRow | RankStatus) -> bool:
    """Whether ``memory_cell`` shows the modelled figure: only with nothing measured."""
    return row.source == "modelled" and row.allocated is not None and row.rss is None


def memory_cell(row: RankRow | RankStatus) -> str:
    """A rank row's memory as one cell, one kind of figure for the whole run: the
    CUDA allocator's allocated bytes, else the process's RSS (both measured). The
    modelled figure of a CPU run (the allocations made inside a profiled step, as
    the CUDA caching allocator would hold them: no weights, kilobytes for a model
    of megabytes) is no rank's memory; ``~`` only when nothing was measured."""
    if row.allocated is not None and row.source != "modelled":
        return format_bytes(row.allocated)
    if row.rss is not None:
        return f"{format_bytes(row.rss)} rss"
    return f"~{format_bytes(row.allocated)}" if shows_modelled(row) else MISSING


def rows_in_order(ranks: list[Row], order: Any, max_rows: int) -> list[Row]:
    """At most ``max_rows`` rows: ``order``'s first (indices into ``ranks``:
    ranks in trouble, then the slowest), then the rest. An ``order`` read
    from a file may be anything: what is not an index is skipped."""
    if len(ranks) <= max_rows:
        return list(ranks)
    picked = [i for i in order if isinstance(i, int) and 0 <= i < len(ranks)] if (
        isinstance(order, (list, tuple))) else []
    return [ranks[i] for i in dict.fromkeys([*picked, *range(len(ranks))])][:max_rows]


def more_ranks_line(hidden: int, spread: Any) -> str:
    """The line under a cut table: how many ranks it leaves out, and the step
    time of all ranks (``spread``: median, min, max; left out when not three numbers)."""
    times = ""
    if isinstance(spread, (list, tuple)) and len(spread) == 3 and all(
            isinstance(v, (int, float)) for v in spread):
        median, low, high = (format_ms(v, unit=False) for v in spread)
        times = f"; step ms over all ranks: median {median}, min {low}, max {high}"
    return (f"... {hidden:,} more ranks, not shown (the rows above: ranks in trouble, then "
            f"the slowest){times}")


#: what the lines after a wrapped verdict's first start with
VERDICT_INDENT = "  "


def verdict_lines(view: RunView, width: int | None = None) -> list[str]:
    """The verdict line; with ``width``, wrapped on word boundaries to that
    many columns, the lines after the first indented (a terminal would cut
    a long one mid-word)."""
    text = f"verdict: {finding_text(view.verdict)}"
    return [text] if width is None else wrap_words(text, width)


def lines(view: RunView, header: str = "", max_rows: int | None = None,
          width: int | None = None) -> list[str]:
    """The summary as text lines: verdict first, then one row per rank.

    ``max_rows``: at most this many rank rows (a redraw taller than the
    terminal cannot move back up over itself), in ``view.order``, then one
    line for the rest. ``width``: the verdict wrapped to it (``verdict_lines``),
    and every line of words under the table too (its footnote, the notes), on
    word boundaries; the table's rows are kept whole.
    """
    out = [header] if header else []
    out += verdict_lines(view, width)
    slow = view.slow.rank
    out.append(f"ranks: {view.attached} of {view.world_size or '?'} attached"
               f"; slow rank: {'none' if slow is None else slow}"
               f"; dropped messages: {view.dropped}"
               + (f"; restarts: {len(view.restarts)}" if view.restarts else ""))
    shown = view.ranks if max_rows is None else rows_in_order(view.ranks, view.order, max_rows)
    # as wide as the longest state shown ("ended by its agent" is 18): never cut a word
    sw = max([5, *(len(str(row.state)) for row in shown)])
    out.append(f"{'rank':>4} {'node':>4} {'host':<12} {'state':<{sw}} {'steps':>5} "
               f"{'step ms':>8} {'data ms':>8} {'memory':>14}")
    for row in shown:
        node = MISSING if row.node is None else str(row.node)
        mark = " <- slow" if row.rank == slow else ""
        out.append(f"{row.rank:>4} {node:>4} {str(row.host or MISSING)[:12]:<12} "
                   f"{row.state:<{sw}} {row.steps or 0:>5} "
                   f"{format_ms(row.step_ms, unit=False):>8} "
                   f"{format_ms(row.data_ms, unit=False):>8} "
                   f"{memory_cell(row):>14}{mark}")
    table = len(out)
    if any(row.step_ms is not None for row in shown):
        out.append(f"step ms, data ms: each rank's median over its last {WINDOW} steps, "
                   "the steps the verdict compares (evaluation and checkpoint spans left out)"
                   + ("; the slow rank's own step can be the shorter: the others' steps "
                      "hold their wait for it" if slow is not None else ""))
    if len(shown) < len(view.ranks):
        out.append(more_ranks_line(len(view.ranks) - len(shown), view.spread))
    if any(shows_modelled(row) for row in shown):
        out.append("~ memory modelled: the allocations made inside the profiled steps "
                   "(not the weights or other tensors made before), replayed through the "
                   "CUDA caching-allocator model")
    for node in view.lost:
        out.append(f"lost: {node.words}")
    for c in view.creep:
        out.append(f"memory: {c.words}")
    out += [restart_line(r.number, r.words) for r in view.restarts]
    out += [f"note: {n}" for n in view.notes]
    if width is None:
        return out
    return out[:table] + [part for line in out[table:] for part in wrap_words(line, width)]


def wrap_words(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` columns, broken between words
    (a terminal breaks a long line wherever the column ends, mid-word), the
    lines after the first indented; a word longer than a line stays whole."""
    return textwrap.wrap(text, max(20, width), subsequent_indent=VERDICT_INDENT,
                         break_long_words=False, break_on_hyphens=False) or [text]


def one_line(view: RunView) -> str:
    """The log form: the verdict and each rank's median step time."""
    if not view.ranks:  # before the first rank attaches: say so, not an empty list
        steps = "none yet, no rank attached"
    elif len(view.ranks) <= LOG_RANKS or view.spread is None:
        steps = ", ".join(f"r{row.rank} {format_ms(row.step_ms, unit=False)}"
                          for row in view.ranks)
    else:
        median, low, high = (format_ms(v, unit=False) for v in view.spread)
        steps = f"median {median}, min {low}, max {high} over {len(view.ranks)} ranks"
    return f"torchlens run: {finding_text(view.verdict)} | step ms: {steps} | dropped {view.dropped}"


class TerminalSummary:
    """Redraws in place on a TTY, logs a line every ``LOG_EVERY_S`` otherwise."""

    def __init__(self, stream: TextIO | None = None, tty: bool | None = None) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.drawn = 0
        self.last = 0.0
        self.cost = 0.0  # seconds the last frame took to compute and draw (set by the loop)

    def due(self) -> bool:
        # a frame that took long (many ranks, a busy machine) spaces the next
        # ones out, so drawing never takes more than a quarter of the loop
        every = max(REDRAW_S if self.tty else LOG_EVERY_S, COST_FACTOR * self.cost)
        return time.monotonic() - self.last >= every

    def draw(self, view: RunView, header: str = "") -> None:
        self.last = time.monotonic()
        if not self.tty:
            print(one_line(view), file=self.stream, flush=True)
            return
        # a line the terminal wraps would make the next redraw move up too few
        # lines: wrap them here, where they are counted (a restart's sentence
        # is longer than a terminal is wide)
        size = shutil.get_terminal_size()
        width = max(20, size.columns - 1)
        said = sum(len(textwrap.wrap(restart_line(r.number, r.words), width))
                   for r in view.restarts)
        # the rows besides the ranks': verdict, totals, heading, the rest, notes
        rows = max(4, size.lines - 8 - len(view.lost) - len(view.creep) - said
                   - len(view.notes))
        text = [part for t in lines(view, header, max_rows=rows)
                for part in (textwrap.wrap(t, width, subsequent_indent="  ") or [""])]
        up = _UP.format(n=self.drawn) if self.drawn else ""
        self.stream.write(up + _CLEAR + "\n".join(text) + "\n")
        self.stream.flush()
        self.drawn = len(text)

    def say(self, text: str) -> None:
        """A line above the redrawn block (it is drawn again below it)."""
        if self.tty and self.drawn:
            self.stream.write(_UP.format(n=self.drawn) + _CLEAR)
            self.drawn = 0
        print(text, file=self.stream, flush=True)

    def say_words(self, text: str) -> None:
        """``say`` a sentence: on a TTY wrapped on words at the terminal's width
        (the terminal would cut it mid-word), in a log one line to grep."""
        if self.tty:
            text = "\n".join(wrap_words(text, shutil.get_terminal_size().columns - 1))
        self.say(text)

    def final(self, view: RunView, header: str = "", width: int | None = None) -> None:
        """The full block once more, in place on a TTY and in full in a log; the
        verdict wrapped to ``width`` (default: on a TTY the terminal's, less one
        column, which would cut it mid-word; a log keeps it one line to grep)."""
        if self.tty and self.drawn:
            self.stream.write(_UP.format(n=self.drawn) + _CLEAR)
        self.drawn = 0
        if width is None and self.tty:
            width = shutil.get_terminal_size().columns - 1
        print("\n".join(lines(view, header, width=width)), file=self.stream, flush=True)
