"""Draws docs/architecture.svg, the one picture of the whole deployment.

The picture is data: zones (trust boundaries), boxes (processes, topics, state files, keys)
and arrows (who sends what to whom). Edit them here and run

    .venv/bin/python docs/gen_architecture.py

tests/test_architecture_doc.py fails when the committed SVG is not what this script draws,
so the picture cannot drift from its source. Standard library only; the output is
deterministic (no timestamps, fixed float formatting).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

OUT = Path(__file__).with_name("architecture.svg")
WIDTH, HEIGHT = 1320, 830

# fill, stroke per kind of box; the legend lists them in this order
KINDS: dict[str, tuple[str, str, str]] = {
    "process": ("#e8f0fe", "#3b6fd1", "process or library code"),
    "topic": ("#fff4d6", "#c79100", "MQTT topic"),
    "state": ("#e6f4ea", "#2e7d32", "state on disk"),
    "key": ("#fde7e9", "#c62828", "key (private: never leaves its box)"),
    "output": ("#f3e8fd", "#7b3fb8", "what operators read"),
}


@dataclass(frozen=True)
class Zone:
    """A trust boundary: what runs inside it and what it is trusted with."""

    title: str
    trusted: str
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class Box:
    kind: str
    title: str
    x: int
    y: int
    w: int
    lines: tuple[str, ...] = ()

    @property
    def h(self) -> int:
        return 24 + 15 * len(self.lines)


@dataclass(frozen=True)
class Arrow:
    points: tuple[tuple[int, int], ...]
    label: str = ""
    label_at: tuple[int, int] | None = None
    dashed: bool = False


@dataclass
class Picture:
    zones: list[Zone] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)


def picture() -> Picture:
    p = Picture()
    p.zones += [
        Zone(
            "Operator",
            "announces the spec and keys, pins keys, plans the budget",
            40,
            16,
            1260,
            118,
        ),
        Zone(
            "Device (coco device, libcoco, coco fleet)",
            "trusted with its own reading only",
            40,
            160,
            320,
            430,
        ),
        Zone(
            "Shuffler (coco shuffler, one per shard)",
            "sees who sent which report, releases none of it",
            390,
            160,
            330,
            430,
        ),
        Zone(
            "Aggregator (coco aggregator run)",
            "trusted with nothing: sees only shuffled (seed, z)",
            750,
            160,
            550,
            430,
        ),
        Zone(
            "MQTT broker (Mosquitto, or a NATS cluster)",
            "sees device ids in topics, never a reading",
            40,
            620,
            1260,
            130,
        ),
    ]
    p.boxes += [
        # operator
        Box(
            "process",
            "coco announce",
            55,
            58,
            230,
            ("spec, round_seconds, min_batch,", "batch public key(s), shard layouts"),
        ),
        Box(
            "process",
            "coco credentials",
            300,
            58,
            230,
            ("per-device MQTT passwords,", "the shuffler's batch key pair"),
        ),
        Box(
            "process",
            "coco aggregator trust",
            545,
            58,
            230,
            ("pins an announced batch key", "(key rotation, reshard)"),
        ),
        Box(
            "process",
            "coco privacy [calibrate]",
            790,
            58,
            230,
            ("plans eps0 and t for a target", "epsilon_total over a horizon"),
        ),
        Box(
            "output",
            "Prometheus, Grafana",
            1035,
            58,
            250,
            ("scrape every service's /metrics;", "dashboard and alerts"),
        ),
        # device
        Box("process", "encoder", 55, 210, 290, ("reading -> s-sparse ternary vector",)),
        Box(
            "process",
            "CoCo / Collision randomiser",
            55,
            263,
            290,
            (
                "eps0-LDP, on the device: the vector",
                "becomes one report (seed, z),",
                "randomness from its CSPRNG",
            ),
        ),
        Box("state", "budget ledger", 55, 346, 290, ("spent budget, written before a report",)),
        Box(
            "process",
            "publisher",
            55,
            399,
            290,
            ("one report per round, QoS 1,", "to its own ingress topic"),
        ),
        Box(
            "key",
            "MQTT credentials",
            55,
            467,
            290,
            ("per-device password and role:", "may publish to its own topic only"),
        ),
        # shuffler
        Box(
            "process",
            "core (pure state machine, no I/O)",
            405,
            210,
            300,
            (
                "round window; one report per device",
                "per round; whole-round release in",
                "batches >= min_batch, uniformly",
                "shuffled",
            ),
        ),
        Box(
            "state",
            "store: effects.log, checkpoint",
            405,
            308,
            300,
            (
                "write-ahead log in --state-dir; a",
                "report is acknowledged once logged;",
                "a torn tail is told from damage",
            ),
        ),
        Box(
            "key",
            "batch signing key (Ed25519, private)",
            405,
            391,
            300,
            ("signs batches and manifests",),
        ),
        Box(
            "process",
            "shell: ingest, publish, lease",
            405,
            468,
            300,
            (
                "drops the device id; publishes",
                "signed batches and manifests;",
                "holds its shard's lease",
            ),
        ),
        # aggregator, left column: a batch climbs from the shell to the estimates
        Box(
            "process",
            "estimation",
            765,
            210,
            260,
            ("unbiased sums per dimension:", "means, frequencies, intervals"),
        ),
        Box(
            "process",
            "core (I/O-free rules)",
            765,
            278,
            260,
            ("horizon; each batch applied once;", "manifests reconcile rounds"),
        ),
        Box(
            "key",
            "pinned batch keys (trust file)",
            765,
            346,
            260,
            ("only announced, pinned keys", "verify a batch or manifest"),
        ),
        Box(
            "process",
            "service shell",
            765,
            470,
            260,
            ("MQTT session, acknowledgements,", "HTTP server, metrics"),
        ),
        # aggregator, right column
        Box(
            "process",
            "accountant",
            1055,
            210,
            230,
            ("certified blanket bound per", "release; PLD composition"),
        ),
        Box(
            "state",
            "privacy ledger",
            1055,
            278,
            230,
            ("<checkpoint>.ledger (and .prev):", "participations per round"),
        ),
        Box(
            "state",
            "checkpoint (two generations)",
            1055,
            346,
            230,
            ("sums, ids, horizon; per-round rows", "in .series; PUBACK once written"),
        ),
        Box(
            "output",
            "/estimates, /metrics, /ready",
            1055,
            414,
            230,
            ("estimates with intervals, n,", "epsilon_central, epsilon_total"),
        ),
        Box("output", "live page", 1055, 482, 230, ("estimates and epsilon over time",)),
        # broker topics
        Box(
            "topic",
            "coco/v1/<dep>/spec",
            55,
            665,
            180,
            ("retained announcement,", "read by every party"),
        ),
        Box(
            "topic",
            "ingress/[<L>/]<device-id>",
            250,
            665,
            250,
            ("16-byte report, QoS 1; PUBACK", "once the shuffler logged it"),
        ),
        Box(
            "topic",
            "batches/<L>, manifests/<L>",
            560,
            665,
            270,
            ("Ed25519-signed shuffled batches", "and the manifests of each release"),
        ),
        Box("topic", "shards/<L>/lease", 1055, 665, 230, ("retained: one shuffler per shard",)),
    ]
    p.arrows += [
        # device
        Arrow(((200, 249), (200, 263))),
        Arrow(((200, 332), (200, 346))),
        Arrow(((200, 385), (200, 399))),
        Arrow(((345, 426), (375, 426), (375, 665)), "report (seed, z)", (262, 609)),
        # shuffler
        Arrow(((470, 665), (470, 537)), "subscribe", (478, 609)),
        Arrow(((650, 537), (650, 665)), "release", (600, 609)),
        # aggregator
        Arrow(((800, 665), (800, 524)), "verify, apply, PUBACK", (808, 609)),
        Arrow(((895, 470), (895, 400))),
        Arrow(((895, 346), (895, 332))),
        Arrow(((895, 278), (895, 264))),
        Arrow(((1025, 305), (1055, 305))),
        Arrow(((1170, 278), (1170, 264))),
        Arrow(((1025, 320), (1040, 320), (1040, 373), (1055, 373))),
        # operator
        Arrow(
            ((70, 100), (70, 146), (26, 146), (26, 692), (55, 692)),
            "announce (retained)",
            (78, 150),
        ),
    ]
    return p


def _text(
    x: float,
    y: float,
    s: str,
    *,
    size: int = 12,
    weight: str = "normal",
    fill: str = "#222",
    anchor: str = "start",
) -> str:
    return (
        f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" fill="{fill}" '
        f'text-anchor="{anchor}">{escape(s)}</text>'
    )


def render(p: Picture) -> str:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, '
        'sans-serif">',
        "<title>coco-fleet: processes, topics, state files, keys and trust boundaries</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#444"/></marker></defs>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
    ]
    for z in p.zones:
        out.append(
            f'<rect x="{z.x}" y="{z.y}" width="{z.w}" height="{z.h}" rx="10" fill="#fafafa" '
            'stroke="#555" stroke-width="1.5" stroke-dasharray="7 4"/>'
        )
        out.append(_text(z.x + 12, z.y + 20, z.title, size=14, weight="bold"))
        out.append(_text(z.x + 12, z.y + 36, z.trusted, size=11, fill="#555"))
    for b in p.boxes:
        fill, stroke, _ = KINDS[b.kind]
        out.append(
            f'<rect x="{b.x}" y="{b.y}" width="{b.w}" height="{b.h}" rx="5" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.2"/>'
        )
        out.append(_text(b.x + 8, b.y + 16, b.title, size=12, weight="bold"))
        for i, line in enumerate(b.lines):
            out.append(_text(b.x + 8, b.y + 32 + 15 * i, line, size=11, fill="#333"))
    for a in p.arrows:
        points = " ".join(f"{x},{y}" for x, y in a.points)
        dash = ' stroke-dasharray="5 3"' if a.dashed else ""
        out.append(
            f'<polyline points="{points}" fill="none" stroke="#444" stroke-width="1.4"'
            f'{dash} marker-end="url(#arrow)"/>'
        )
        if a.label and a.label_at is not None:
            out.append(_text(a.label_at[0], a.label_at[1], a.label, size=11, fill="#444"))
    # legend, one row under the broker
    x, y = 40, 790
    out.append(_text(x, y + 11, "Legend:", size=12, weight="bold"))
    x += 62
    entries = [
        (*colours, meaning, "") for colours, meaning in (((f, s), m) for f, s, m in KINDS.values())
    ]
    entries.append(("#fafafa", "#555", "trust boundary", ' stroke-dasharray="5 3"'))
    for fill, stroke, meaning, dash in entries:
        out.append(
            f'<rect x="{x}" y="{y}" width="26" height="14" rx="3" fill="{fill}" '
            f'stroke="{stroke}"{dash}/>'
        )
        out.append(_text(x + 32, y + 11, meaning, size=11))
        x += 40 + 6 * len(meaning) + 24
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    OUT.write_text(render(picture()), encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
