"""The LoCoMo conversations of tests/fixtures/locomo-dev/, as turns and questions.

One formatting rule for every consumer (both servers and BM25): a turn's
memory text is ``"<speaker>: <text>"``, stamped with its session's date in
ISO-8601, and keyed by its ``dia_id``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "locomo-dev"
ADVERSARIAL_CATEGORY = 5  # questions with no answer in the conversation: nothing to retrieve

_SESSION_KEY = re.compile(r"session_(\d+)")
# "D8:6; D9:17" (two ids in one string) and "D:11:26" (stray colon) occur in the release.
_EVIDENCE_ID = re.compile(r"D:?(\d+):(\d+)")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    timestamp: str  # ISO-8601 of the session start

    @property
    def content(self) -> str:
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    question: str
    evidence: tuple[str, ...]
    category: int


@dataclass(frozen=True)
class Session:
    number: int
    timestamp: str  # ISO-8601 of the session start, as its turns carry
    summary: str  # the release's session_<n>_summary ('' when absent)
    last_dia_id: str  # the session's last turn


@dataclass(frozen=True)
class Conversation:
    name: str  # the file stem, e.g. "26"
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]  # scorable ones only (see load_conversation)
    skipped_questions: int
    sessions: tuple[Session, ...] = ()

    @property
    def agent_id(self) -> str:
        return f"locomo-{self.name}"


def session_timestamp(text: str) -> str:
    """'1:56 pm on 8 May, 2023' -> '2023-05-08T13:56:00+00:00' (the data has no zone; UTC is assumed)."""
    parsed = datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y")
    return parsed.replace(tzinfo=timezone.utc).isoformat()


def normalize_evidence(raw: list[str], known_ids: set[str]) -> tuple[str, ...]:
    """Evidence ids repaired to the turns' own spelling; ids naming no turn are dropped."""
    found: list[str] = []
    for entry in raw:
        for session, turn in _EVIDENCE_ID.findall(entry):
            dia_id = f"D{session}:{turn}"
            if dia_id in known_ids and dia_id not in found:
                found.append(dia_id)
    return tuple(found)


def load_conversation(path: Path) -> Conversation:
    """Every turn, plus the questions that can be scored.

    A question is skipped when it is adversarial (category 5) or when none of
    its evidence ids names a turn of the conversation.
    """
    data = json.loads(path.read_text())
    sessions = sorted(
        (int(match.group(1)), key)
        for key in data
        if (match := _SESSION_KEY.fullmatch(key)) and isinstance(data[key], list)
    )
    turns: list[Turn] = []
    session_rows: list[Session] = []
    for number, key in sessions:
        stamp = session_timestamp(data[f"session_{number}_date_time"])
        for raw in data[key]:
            turns.append(Turn(dia_id=raw["dia_id"], speaker=raw["speaker"], text=raw["text"], timestamp=stamp))
        if data[key]:
            summary = str(data.get(f"session_{number}_summary") or "").strip()
            session_rows.append(Session(number, stamp, summary, data[key][-1]["dia_id"]))
    known = {turn.dia_id for turn in turns}
    questions: list[Question] = []
    skipped = 0
    for raw in data["qa"]:
        evidence = normalize_evidence(raw.get("evidence") or [], known)
        if raw.get("category") == ADVERSARIAL_CATEGORY or not evidence:
            skipped += 1
            continue
        questions.append(Question(question=str(raw["question"]), evidence=evidence, category=int(raw["category"])))
    return Conversation(
        name=path.stem,
        turns=tuple(turns),
        questions=tuple(questions),
        skipped_questions=skipped,
        sessions=tuple(session_rows),
    )


def load_conversations(data_dir: Path = DEFAULT_DATA_DIR) -> list[Conversation]:
    paths = sorted(data_dir.glob("*.json"))
    if not paths:
        raise SystemExit(f"no LoCoMo conversation files (*.json) in {data_dir}")
    return [load_conversation(path) for path in paths]
