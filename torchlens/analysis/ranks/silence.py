"""A rank that went silent and came back: stopped (``kill -STOP``, a scheduler's
suspend, a debugger), swapped out, or on a frozen host, for seconds on end.

Pure functions over the collector's silent spells (``RankSnapshot.spells``,
``model.messages.SilentSpell``: measured by ``capture.ranks.collector``).
Once such a rank sends again its state is ``running`` and, at the end,
``finished``: without this rule the run's last words would never say that
it stopped, nor that the job lost that time.

Definitions:

- A *spell*: the rank's heartbeat (sent by a thread of its own twice a
  second, whatever the training does) stopped for at least the collector's
  ``SPELL_S`` (5 s) while the collector kept polling, then came back. Its
  length is the gap between the two heartbeats on the collector's clock; its
  step is the step the rank was in at its last heartbeat before it
  (``steps_done``, counted from 0).
- Another rank *waited for it*: its step that overlaps the spell lasted at
  least ``WAITED`` (half) of the spell. A rank blocked in a collective for
  the silent rank makes one long step that spans the spell.
- Another rank *went on*: it finished at least ``WENT_ON_STEPS`` (2) steps
  that began and ended inside the spell.
- Neither: its records of that time did not reach the collector (it kept
  only the newest; or the rank ended), and the words say nothing of it.

The spell leads the verdict of a run where nothing failed or was lost
(``leads``): a rank that stopped for seconds while the others waited cost
the job that time, more than any slow rank's median. Every spell is also a
note, so the manifest keeps them all.

While it lasts (the live words, ``silent_now``): a rank is *silent* once its
newest heartbeat is older than ``SILENT_AFTER_S`` (a missed heartbeat:
they come every 0.5 s and the collector reads every 0.25 s), until it sends
again or the collector's ``lost_after_s`` passes (then it is lost:
``verdict.lost_nodes``). Only what is known is said of the others
(``since_silent``): on each other rank's own clock, the silent rank's last
heartbeat is its own newest heartbeat's time less the difference of their
ages on the collector's clock (hosts' skewed clocks never compared); a rank
may have run up to one heartbeat interval past its last one, so the steps
that count are those that ended ``SILENT_AFTER_S`` after it. Another rank
*went on* when ``WENT_ON_STEPS`` of its steps ended since; it *waits for
it* when none did while its own heartbeats kept coming for long enough to
have ended that many (its median step); else nothing is said of it yet. Its
steps are its records', or its heartbeat's count past the step it was in
then where that is more (a rank holds its records while the collector is
behind).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from torchlens.analysis.ranks.slow import WINDOW, rank_list
from torchlens.model.findings import FAILED, WARNING, Figure, Finding
from torchlens.model.messages import RankInfo, RankSnapshot, SilentSpell
from torchlens.model.records import StepRecord

#: the finding's code
SILENT_RANK = "silent_rank"
#: the finding's code while the rank is still silent
SILENT_NOW = "silent_now"
#: a rank whose newest heartbeat is older than this (s, collector clock) missed
#: one: they come every 0.5 s (``capture.ranks.attach.HEARTBEAT_S``), the
#: collector reads them every 0.25 s, and a loaded machine delays one by a few
#: tenths (a rank's first step under load: 1.3 s was seen on a healthy rank)
SILENT_AFTER_S = 1.5
#: another rank waited when its step over the spell lasted this share of it
WAITED = 0.5
#: another rank went on when it finished this many steps inside the spell
WENT_ON_STEPS = 2


@dataclass(frozen=True)
class Silence:
    """One spell, judged: who waited for the silent rank and who went on."""

    rank: int
    silent_s: float
    step: int | None
    waited: list[int]
    went_on: list[int]
    others: list[int]

    @property
    def words(self) -> str:
        """``rank 1 went silent for 20.7 s at step 37; the others waited for it``."""
        at = f" at step {self.step}" if self.step is not None else ""
        said = f"rank {self.rank} went silent for {self.silent_s:.1f} s{at}"
        parts = []
        if self.waited:
            who = ("the others" if self.waited == self.others and len(self.others) > 0
                   else rank_list(self.waited))
            parts.append(f"{who} waited for it")
        if self.went_on:
            who = ("the others" if self.went_on == self.others else rank_list(self.went_on))
            parts.append(f"{who} went on")
        return "; ".join([said, *parts])


def judge(spell: SilentSpell, ranks: list[int],
          records: list[list[StepRecord]] | None = None) -> Silence:
    """``spell`` judged against the other ranks (``ranks``: every attached one).
    ``records``: each rank's step records, where the snapshot still holds them
    from before the spell: the steps inside it are counted from
    ``SILENT_AFTER_S`` after its start (the silent rank may have stepped on
    for up to a heartbeat interval past its last heartbeat: a peer's steps
    then are not steps it went on without it)."""
    others = sorted(r for r in ranks if r != spell.rank)
    waited = [r for r in others if spell.longest.get(r, 0.0) >= WAITED * spell.silent_s]
    went_on = [r for r in others if r not in waited
               and _within(spell, r, records) >= WENT_ON_STEPS]
    return Silence(spell.rank, spell.silent_s, spell.step, waited, went_on, others)


def _within(spell: SilentSpell, rank: int, records: list[list[StepRecord]] | None) -> int:
    """``rank``'s steps that began and ended inside ``spell``: the collector's
    count, less those that began in its first ``SILENT_AFTER_S`` where the
    records still reach back to its start."""
    mine = records[rank] if records is not None and rank < len(records) else []
    a, b = spell.t, spell.t + spell.silent_s
    counted = spell.within.get(rank, 0)
    if not mine or mine[0].t0 > a:
        return counted
    early = sum(1 for rec in mine if a <= rec.t0 < a + SILENT_AFTER_S and rec.t1 <= b
                and not rec.labelled)
    return max(0, counted - early)


def silent_spells(snap: RankSnapshot) -> list[Silence]:
    """Every spell of the run, oldest first."""
    ranks = [i.rank for i in snap.ranks if i is not None]
    return [judge(sp, ranks, snap.steps) for sp in snap.spells]


def silence_finding(spells: list[Silence]) -> Finding | None:
    """The longest spell as a finding (the others counted in its sentence); None without."""
    if not spells:
        return None
    top = max(spells, key=lambda s: s.silent_s)
    more = len(spells) - 1
    sentence = top.words + (f" (and {more} shorter silent spell{'s' if more > 1 else ''}: "
                            "the notes list them)" if more else "")
    cause = ("every other rank waits for it in its next collective" if top.waited
             else "its work was missing from the job meanwhile")
    return Finding(WARNING, sentence,
                   (Figure("rank", top.rank), Figure("silent_ms", top.silent_s * 1e3, "ms"),
                    *((Figure("step", top.step),) if top.step is not None else ()),
                    Figure("spells", len(spells))),
                   advice=f"find what stopped rank {top.rank} (kill -STOP or a job "
                          "scheduler's suspend, a debugger, swapping, a frozen host): "
                          f"{cause}",
                   details={"ranks": [top.rank], "waited": top.waited, "went_on": top.went_on},
                   code=SILENT_RANK)


def leads(verdict: Finding, spells: list[Silence]) -> Finding:
    """The verdict of a run with silent spells: the longest spell, unless the
    verdict is a failure (a failed rank, a lost node), which stays first."""
    found = silence_finding(spells)
    if found is None or verdict.severity == FAILED:
        return verdict
    return found


# -- while it lasts ----------------------------------------------------------------------
@dataclass(frozen=True)
class SilentNow:
    """A rank silent now (no goodbye, its heartbeat older than ``SILENT_AFTER_S``
    and not yet past the lost bound), with what is known of the others."""

    rank: int
    silent_s: float
    step: int | None
    waiting: list[int]
    went_on: list[int]
    others: list[int]
    #: steps each rank that went on ended since
    since: dict[int, int]

    @property
    def words(self) -> str:
        """``rank 1 silent for 4.2 s (its last heartbeat in step 96); the others
        wait for it: none of their steps ended since``."""
        at = f" (its last heartbeat in step {self.step})" if self.step is not None else ""
        parts = [f"rank {self.rank} silent for {self.silent_s:.1f} s{at}"]
        if self.waiting:
            alone = len(self.waiting) == 1 and self.waiting != self.others
            who = "the others" if self.waiting == self.others else rank_list(self.waiting)
            parts.append(f"{who} {'waits' if alone else 'wait'} for it: "
                         f"{'none of its' if alone else 'none of their'} steps ended since")
        if self.went_on:
            who = "the others" if self.went_on == self.others else rank_list(self.went_on)
            most = max(self.since[r] for r in self.went_on)
            parts.append(f"{who} went on ({most} step{'s' if most != 1 else ''} since)")
        return "; ".join(parts)


def steps_since(silent: RankInfo, other: RankInfo, records: list[StepRecord]
                ) -> tuple[int, bool] | None:
    """How many of ``other``'s steps ended since ``silent``'s last heartbeat (on
    ``other``'s clock, module docstring), and whether ``other`` reported long
    enough after it for ``WENT_ON_STEPS`` of its steps to have ended; None when
    unknown (``other`` has no step record yet: nothing says it waits). Without
    heartbeat times (an older collector's): the steps between the two ranks'
    newest ``steps_done``, the silent one's step and the next being the ones a
    rank waiting for it is in."""
    t = other.heartbeat.t
    if t is not None and not records:
        return None
    if t is None:
        mine, theirs = silent.heartbeat.steps_done, other.heartbeat.steps_done
        if mine is None or theirs is None:
            return None
        return max(0, theirs - (mine + 1)), True
    cut = t - (silent.silent_s - other.silent_s) + SILENT_AFTER_S
    ended = sum(1 for rec in records if rec.t1 > cut)
    # a rank holds its records while the collector is behind: its heartbeat's
    # step count, newer, says how far it went past the step it was in at the cut
    done = other.heartbeat.steps_done
    before = [rec.step for rec in records if rec.t1 <= cut]
    if done is not None and before:
        ended = max(ended, done - (before[-1] + 1))
    typical = median(rec.t1 - rec.t0 for rec in records[-WINDOW:])
    return ended, t - cut >= WENT_ON_STEPS * typical


def since_silent(silent: RankInfo, others: list[tuple[RankInfo, list[StepRecord]]]
                 ) -> tuple[list[int], list[int], dict[int, int]]:
    """(waiting, went_on, steps since) of ``others`` (each still running, with its
    step records) for the rank ``silent``: the definitions are the module's."""
    waiting, went_on, since = [], [], {}
    for other, records in others:
        did = steps_since(silent, other, records)
        if did is None:
            continue
        ended, long_enough = did
        since[other.rank] = ended
        if ended >= WENT_ON_STEPS:
            went_on.append(other.rank)
        elif ended == 0 and long_enough and other.silent_s <= SILENT_AFTER_S:
            waiting.append(other.rank)
    return sorted(waiting), sorted(went_on), since


def silent_now(ranks: list[RankInfo | None], states: list[str],
               steps: list[list[StepRecord]]) -> list[SilentNow]:
    """The ranks silent now (state ``silent``), longest first; ``steps``: each
    rank's step records (set-up windows left out)."""
    running = [(i, steps[i.rank] if i.rank < len(steps) else [])
               for i, s in zip(ranks, states, strict=True) if i is not None and s == "running"]
    out = []
    for info, state in zip(ranks, states, strict=True):
        if info is None or state != "silent":
            continue
        others = sorted(o.rank for o, _ in running)
        waiting, went_on, since = since_silent(info, running)
        out.append(SilentNow(info.rank, info.silent_s, info.heartbeat.steps_done,
                             waiting, went_on, others, since))
    return sorted(out, key=lambda s: (-s.silent_s, s.rank))


def silent_now_finding(now: list[SilentNow], lost_after_s: float) -> Finding | None:
    """The longest silence now as a finding (the others silent too named); None without."""
    if not now:
        return None
    top, more = now[0], [s.rank for s in now[1:]]
    sentence = top.words + (f" ({rank_list(more)} silent too)" if more else "")
    return Finding(WARNING, sentence,
                   (Figure("rank", top.rank), Figure("silent_ms", top.silent_s * 1e3, "ms"),
                    *((Figure("step", top.step),) if top.step is not None else ())),
                   advice=f"a rank silent for {lost_after_s:.0f} s is counted lost; find what "
                          f"stops rank {top.rank}: a stopped process (kill -STOP, a debugger), "
                          "swapping, a frozen host or a hang",
                   details={"ranks": [top.rank, *more], "waiting": top.waiting,
                            "went_on": top.went_on},
                   code=SILENT_NOW)


def now_leads(verdict: Finding, now: list[SilentNow], lost_after_s: float) -> Finding:
    """The verdict while a rank is silent: the silence, unless the verdict is a
    failure (a failed rank, a lost node), which stays first."""
    found = silent_now_finding(now, lost_after_s)
    if found is None or verdict.severity == FAILED:
        return verdict
    return found
