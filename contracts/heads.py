"""Draft head specs: which LM head the draft uses, and its budget at each draft position.

One grammar for every command (`python -m model --head`, `measure`, `validate --heads`, `sim --head`):

    dense                  the full head
    flashhead              FlashHead at its default probes (clusters / 16)
    flashhead:P            FlashHead scoring P clusters exactly at every draft position
    shortlist:N            the N most frequent tokens (a built shortlist asset)
    router:C               a learned router's C best clusters (a built router asset)
    KIND:B1,B2,...,BK      any budgeted kind per draft position 1..K; the last budget repeats

Budgets per position follow DynaSpec and PA-FR: the first draft positions decide most of the
acceptance, so they may get more budget. Lists of specs (sweeps, `--heads`) are joined by `+`, or by
`,` when every piece that is a bare number continues the spec before it (`dense,flashhead:64,32`).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.cli import UsageError

HEAD_KINDS = ("dense", "flashhead", "shortlist", "router")
BUDGET_UNIT = {"flashhead": "probes", "shortlist": "tokens", "router": "clusters"}
BUILT_KINDS = ("shortlist", "router")  # kinds whose assets python -m model.build_head builds
HEAD_FORMS = "dense, flashhead, flashhead:P, shortlist:N, router:C, or KIND:B1,B2,... per draft position"
MAX_POSITIONS = 64


@dataclass(frozen=True)
class HeadSpec:
    """A head kind and its budgets per draft position (empty: dense, or FlashHead's default probes)."""

    kind: str
    budgets: tuple[int, ...] = ()

    def budget(self, position: int) -> int | None:
        """The budget at draft position `position` (0-based); the last one repeats past the list."""
        if not self.budgets:
            return None
        return self.budgets[min(position, len(self.budgets) - 1)]

    @property
    def positional(self) -> bool:
        return len(set(self.budgets)) > 1

    @property
    def label(self) -> str:
        """The spec as written in canonical form (what traces and summaries record)."""
        return self.kind if not self.budgets else f"{self.kind}:{','.join(map(str, self.budgets))}"

    def check_budgets(self, limit: int, what: str) -> None:
        """Bad input unless every budget is at most `limit` (the vocabulary, the clusters)."""
        over = [b for b in self.budgets if b > limit]
        if over:
            raise UsageError(f"head {self.label!r}: budget {over[0]} exceeds the {limit} {what}; valid: {HEAD_FORMS}")


def parse_head(text: str, option: str = "--head") -> HeadSpec:
    """One head spec -> HeadSpec; bad input names the option and the valid forms."""
    text = str(text).strip()
    kind, colon, rest = text.partition(":")
    kind = kind.strip()
    if kind not in HEAD_KINDS:
        raise UsageError(f"{option}: unknown head {text!r}; valid: {HEAD_FORMS}")
    if not colon:
        if kind in BUILT_KINDS:
            raise UsageError(f"{option}: head {kind!r} needs a budget ({kind}:N); valid: {HEAD_FORMS}")
        return HeadSpec(kind)
    if kind == "dense":
        raise UsageError(f"{option}: head 'dense' takes no budget, got {text!r}; valid: {HEAD_FORMS}")
    pieces = [p.strip() for p in rest.split(",")]
    if not all(p.isdigit() for p in pieces):
        raise UsageError(f"{option}: head {text!r}: budgets must be positive integers; valid: {HEAD_FORMS}")
    budgets = tuple(int(p) for p in pieces)
    if min(budgets) < 1:
        raise UsageError(f"{option}: head {text!r}: budgets must be >= 1; valid: {HEAD_FORMS}")
    if len(budgets) > MAX_POSITIONS:
        raise UsageError(f"{option}: head {text!r}: at most {MAX_POSITIONS} per-position budgets")
    return HeadSpec(kind, budgets)


def check_assets(spec: HeadSpec, folder) -> None:
    """Bad input when a kind that needs built assets is given no assets folder."""
    if spec.kind in BUILT_KINDS and not folder:
        raise UsageError(
            f"head {spec.label!r} needs built assets: pass --head-assets DIR "
            f"(build them with python -m model.build_head --kind {spec.kind} --out DIR)"
        )


def parse_heads(text: str, option: str = "--heads") -> tuple[HeadSpec, ...]:
    """Specs joined by '+' or ','; a bare number after ',' continues the previous spec's budgets.
    Repeats are dropped, order kept. An empty item is a typo (`flashhead:1,,2`, `dense+`): refused."""
    if not str(text).strip():
        raise UsageError(f"{option}: no head given; valid: {HEAD_FORMS}")
    specs: list[str] = []
    for piece in (p.strip() for p in str(text).replace("+", ";").replace(",", ";,").split(";")):
        if piece.startswith(","):
            body = piece[1:].strip()
            if body.isdigit() and specs and ":" in specs[-1]:
                specs[-1] += "," + body
                continue
            piece = body
        if not piece:
            raise UsageError(f"{option}: empty item in {text!r}; valid: {HEAD_FORMS}")
        specs.append(piece)
    return tuple(dict.fromkeys(parse_head(s, option) for s in specs))
