"""The soak: many short generations in one engine process, speculation toggled and the draft length
changed between them, watching the process's resident memory, open files and threads.

Why the real worker over its protocol rather than the Engine in this process: the worker is the
process that stays up for hours under the app, and its own parts (the request reader thread, the
per-step events, the origin tracker, the prefix cache between turns, CountTokens' tokenizer copy)
are what could leak; measured from outside (psutil on its pid), the measurement adds nothing to it.

Memory is compared after the first 50 generations (when every speculation setting has run once and
torch's allocator and thread pools are warm) with the end: within 5%. Open files and threads must
not grow. The prefix cache keeps earlier conversations in host memory, by design, up to a budget
(a quarter of RAM, 4 GB at most): the soak gives it PREFIX_CACHE_MB, which it fills within the first
generations, so that what the soak measures after them is the cache evicting, not the cache filling.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from flashdesk import protocol as p
from .common import WorkerGone, WorkerProcess

BASELINE_AFTER = 50
PREFIX_CACHE_MB = "8"
RSS_TOLERANCE = 0.05
# (speculation on, draft length) in turn between generations: off, fixed lengths, the longest, auto
SPECULATION = [(True, None), (False, None), (True, 1), (True, 4), (True, "auto"), (False, 7), (True, 15), (True, 9)]
QUESTIONS = [
    "What is a list?",
    "How do I open a file?",
    "Explain a dictionary.",
    "What does yield do?",
    "Sort a list of tuples.",
    "What is a set?",
    "Write a loop.",
    "What is a class?",
]
MB = 1 << 20


@dataclass
class SoakFigures:
    generations: int = 0
    rss_start_mb: float = 0.0
    rss_end_mb: float = 0.0
    open_files: tuple[int, int] = (0, 0)  # after the baseline's generation, at the end
    threads: tuple[int, int] = (0, 0)
    failures: list[str] = field(default_factory=list)

    @property
    def flat(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        return {
            "generations": self.generations,
            "rss_start_mb": round(self.rss_start_mb, 1),
            "rss_end_mb": round(self.rss_end_mb, 1),
            "open_files_start": self.open_files[0],
            "open_files_end": self.open_files[1],
            "threads_start": self.threads[0],
            "threads_end": self.threads[1],
            "failures": self.failures,
        }


def _conversation(i: int, rng: random.Random) -> list[dict]:
    """One to three turns: follow-ups reuse the engine's cached prefix, new questions replace it."""
    turns = [{"role": "user", "content": rng.choice(QUESTIONS)}]
    for _ in range(i % 3):
        turns += [{"role": "assistant", "content": "Here is one way."}, {"role": "user", "content": "And then?"}]
    return turns


def soak(demo, generations: int, rng: random.Random, log) -> SoakFigures:
    import psutil

    figures = SoakFigures()
    baseline_after = BASELINE_AFTER if generations >= 4 * BASELINE_AFTER else max(1, generations // 5)
    worker = WorkerProcess(env={"FLASHDESK_PREFIX_CACHE_MB": PREFIX_CACHE_MB})
    try:
        worker.send(p.Load(str(demo[0]), str(demo[1]), device="cpu", context=1024))
        loaded = worker.until((p.Loaded, p.Error))[-1]
        if isinstance(loaded, p.Error):
            figures.failures.append(f"the demo pair did not load: {loaded.message}")
            return figures
        process = psutil.Process(worker.pid)
        start = None
        for i in range(generations):
            worker.send(p.SetSpeculation(*SPECULATION[i % len(SPECULATION)]))
            tokens = rng.randint(2, 8)
            temperature = 0.8 if i % 3 == 2 else 0.0
            worker.send(
                p.Generate(
                    f"soak-{i}",
                    _conversation(i, rng),
                    temperature=temperature,
                    seed=i,
                    max_tokens=tokens,
                    ignore_eos=True,
                )
            )
            end = worker.until((p.Finished, p.Error))[-1]
            if isinstance(end, p.Error) or len(end.token_ids) != tokens:
                what = end.message if isinstance(end, p.Error) else f"{len(end.token_ids)} tokens of {tokens}"
                figures.failures.append(f"generation {i + 1}: {what}")
            figures.generations += 1
            if figures.generations == baseline_after:
                start = (process.memory_info().rss, process.num_fds(), process.num_threads())
            if figures.generations % 200 == 0:
                log(f"soak: {figures.generations}/{generations}, RSS {process.memory_info().rss / MB:.1f} MB")
        end_sample = (process.memory_info().rss, process.num_fds(), process.num_threads())
    except WorkerGone as exc:
        figures.failures.append(f"after {figures.generations} generations: {exc}")
        return figures
    finally:
        worker.close()
    figures.rss_start_mb, figures.rss_end_mb = start[0] / MB, end_sample[0] / MB
    figures.open_files, figures.threads = (start[1], end_sample[1]), (start[2], end_sample[2])
    if abs(end_sample[0] - start[0]) > RSS_TOLERANCE * start[0]:
        figures.failures.append(
            f"resident memory went from {figures.rss_start_mb:.1f} MB after "
            f"{baseline_after} generations to {figures.rss_end_mb:.1f} MB (over 5%)"
        )
    if end_sample[1] > start[1]:
        figures.failures.append(f"open files grew from {start[1]} to {end_sample[1]}")
    if end_sample[2] > start[2]:
        figures.failures.append(f"threads grew from {start[2]} to {end_sample[2]}")
    return figures
