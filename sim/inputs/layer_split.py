"""Which transformer layers each (virtual) pipeline stage holds: Megatron-LM's splits, a
split given layer by layer (``--layer-split``) and Megatron-LM's layout string
(``--pipeline-model-parallel-layout``). ``sim.inputs.plan`` explains Megatron-LM's even and
uneven splits; ``ParallelPlan.stage_layers`` calls ``split_layers``.

**A given split** (``--layer-split N,N,...``) takes any layer count. Its entries are the
layers of each pipeline rank, first to last (pp entries), or, with virtual stages, of each
virtual stage in the order the model runs through them (pp·vpp entries: chunk 0 of ranks
0..pp−1, then chunk 1, ...; index ``chunk·pp + rank``). A rank's entry is split over its vpp
chunks as evenly as possible, the earlier chunks taking one layer more when it does not
divide (numpy's ``array_split`` rule): 7 layers over 2 chunks are 4 and 3. Every chunk needs
a layer, so a rank's entry is at least vpp. ``--layer-split auto`` is the split that
balances the stages' estimated times (``sim.program.stage_balance``); until it is worked out, the
layers spread over the virtual stages as evenly as possible.

**A layout** (Megatron-LM's ``--pipeline-model-parallel-layout``, its
``PipelineParallelLayerLayout`` in megatron/core/transformer/pipeline_parallel_layer_layout.py,
parsed here by the same rules in code of our own) names what each virtual stage builds:
``E`` the embedding, ``t`` a transformer layer, ``m`` a multi-token-prediction layer, ``L``
the loss (output layer and loss), stages separated by ``|``, commas ignored, ``(...)*N``
repeating a group (no nesting) and then ``x*N`` repeating one character. The stages are
listed in virtual-stage order (``chunk·pp + rank``), so their count is pp·vpp and sets vpp.
Megatron-LM's rules: E exactly once and first, L exactly once and last, as many ``t`` as the
model has layers and as many ``m`` as ``--mtp-num-layers``, every ``m`` after every ``t``
and all of them in one virtual stage, the last of its rank. Two rules of this simulator on
top: E opens virtual stage 0 and L closes the last one (a stage before E or after L would
hold nothing), and the ``m`` layers sit in the last virtual stage with L (Megatron-LM also
lets them stand on a rank of their own; that is not modelled). Example: DeepSeek-V3's 61
layers on pp 8 with its MTP layer on the last stage, ``Et*7|(t*8|)*6,t*6mL`` (7 + 6·8 + 6).

**Layers of several kinds** (``sim.inputs.layers``: Nemotron-H's Mamba-2, attention and MLP
layers, Qwen3-Next's linear and full attention) are each a ``t``: Megatron-LM's ``LayerType``
has embedding, decoder, mtp and loss only, and a layout places the model's layers in order
whatever their kinds. Megatron-Core's hybrid models place theirs with ``|`` in the hybrid
pattern instead (``--hybrid-override-pattern``, ``sim.inputs.megatron_model.pattern_layout``);
a layout with the pattern's letters (M, *, -) is refused with that reason.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

from sim.errors import InputError, require

FIRST = "first_stage_layers (--decoder-first-pipeline-num-layers)"
LAST = "last_stage_layers (--decoder-last-pipeline-num-layers)"
EMB = "account_for_embedding (--account-for-embedding-in-pipeline-split)"
LOSS = "account_for_loss (--account-for-loss-in-pipeline-split)"
SPLIT = "layer_split (--layer-split)"
LAYOUT = "pipeline_layout (--pipeline-model-parallel-layout)"
LAYOUT_CHARS = "EtmL"
"""Megatron-LM's layer characters: embedding, transformer layer, MTP layer, loss."""


def _others(plan, besides: str) -> list[str]:
    """The other uneven-split options set on ``plan`` (what ``besides`` cannot be combined with)."""
    on = ((FIRST, plan.first_stage_layers is not None), (LAST, plan.last_stage_layers is not None),
          (EMB, plan.account_for_embedding), (LOSS, plan.account_for_loss),
          (SPLIT, plan.layer_split is not None), (LAYOUT, plan.pipeline_layout is not None))
    return [f for f, set_ in on if set_ and f != besides]


def check_layer_split(plan) -> None:
    """``plan.layer_split``: pp (per rank, each >= vpp) or pp·vpp (per virtual stage)
    integers >= 1, and no other uneven option beside it."""
    split = plan.layer_split
    text = ",".join(map(str, split)) if isinstance(split, (tuple, list)) else split
    if split == "auto":
        others = _others(plan, SPLIT)
        require(not others, f"plan: {SPLIT}", text, f"cannot be combined with {', '.join(others)}")
        return
    require(isinstance(split, tuple) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                              for n in split), f"plan: {SPLIT}", text,
            "expected transformer layers per pipeline stage, integers >= 1 separated by commas")
    p, v = plan.pp, plan.vpp
    ways = f"one per pipeline stage (pp = {p})" + (f" or one per virtual stage (pp x vpp = {p * v})" if v > 1 else "")
    require(len(split) in (p, p * v), f"plan: {SPLIT}", text, f"has {len(split)} entries; expected {ways}")
    if v > 1 and len(split) == p:
        require(min(split) >= v, f"plan: {SPLIT}", text,
                f"a pipeline stage's layers are split over its vpp = {v} chunks, so each entry must be >= {v} "
                f"(or give one entry per virtual stage, {p * v} of them)")
    others = _others(plan, SPLIT)
    require(not others, f"plan: {SPLIT}", text, f"cannot be combined with {', '.join(others)}")


def virtual_split(split: tuple, pp: int, vpp: int) -> tuple:
    """Layers per virtual stage (index ``chunk·pp + rank``) of a ``--layer-split``: its
    pp·vpp entries as they are, or each of its pp entries over the rank's chunks, the
    earlier chunks one more when they do not divide (module doc)."""
    if len(split) == pp * vpp:
        return tuple(split)
    return tuple(split[r] // vpp + (c < split[r] % vpp) for c in range(vpp) for r in range(pp))


def spread(num_layers: int, stages: int) -> tuple:
    """``num_layers`` over ``stages`` as evenly as possible, the earlier stages one more."""
    return tuple(num_layers // stages + (i < num_layers % stages) for i in range(stages))


def divisors_text(n: int, limit: int = 8) -> str:
    """The ``limit`` smallest divisors of ``n`` above 1, for messages: divisors up to
    sqrt(n) (at most a million tried, so a typo'd layer count of 1e11 does not hang)
    and their partners."""
    small = [d for d in range(2, min(math.isqrt(n), 10**6) + 1) if n % d == 0]
    large = sorted({n // d for d in small} | ({n} if n > 1 else set()))
    ds = sorted(set(small) | set(large))[:limit]
    return ", ".join(map(str, ds)) or "none"


@lru_cache(maxsize=1024)
def split_layers_cached(num_layers: int, pipeline, name: str = "the model", mtp_num_layers: int = 0) -> tuple:
    """``split_layers``, remembered (its answer is a tuple, and ``pipeline`` a frozen
    section): ``ParallelPlan.layer_range`` asks it for every stage of every plan a search
    estimates. A split that cannot be done raises each time, as ``split_layers`` does."""
    return split_layers(num_layers, pipeline, name, mtp_num_layers)


def split_layers(num_layers: int, pipeline, name: str = "the model", mtp_num_layers: int = 0) -> tuple:
    """Layers per virtual stage (index ``chunk·pp + pp_rank``) of a model of ``num_layers``
    (``name``'s) as the plan's ``pipeline`` section (``sim.inputs.plan_sections.PipelinePlan``)
    says: Megatron-LM's split of its pp x vpp stages (see ``sim.inputs.plan``; uneven with
    ``first_stage_layers``, ``last_stage_layers``, ``account_for_embedding``,
    ``account_for_loss``), ``layer_split`` (``--layer-split``: per rank or per virtual stage;
    "auto" spreads them as evenly as possible until the session balances them) or
    ``pipeline_layout`` (``--pipeline-model-parallel-layout``, checked against the model's
    ``num_layers`` and ``mtp_num_layers``); an ``InputError`` naming the flag when it cannot
    be done."""
    L, p, v = num_layers, pipeline.pp, pipeline.vpp
    first, last, split = pipeline.first_stage_layers, pipeline.last_stage_layers, pipeline.layer_split
    account_for_embedding, account_for_loss = pipeline.account_for_embedding, pipeline.account_for_loss
    layout = None if pipeline.pipeline_layout is None else parse_layout(pipeline.pipeline_layout)
    if layout is not None:
        return layout_layers(layout, L, mtp_num_layers, name)
    if split == "auto":
        require(L >= p * v, f"plan: {SPLIT}", "auto",
                f"needs at least one layer per virtual stage: num_layers {L} of {name} < pp x vpp = {p} x {v}")
        return spread(L, p * v)
    if split is not None:
        require(sum(split) == L, f"plan: {SPLIT}", ",".join(map(str, split)),
                f"adds up to {sum(split)}; the {len(split)} stages must hold the {L} layers of {name}")
        return virtual_split(split, p, v)
    if first is None and last is None and not (account_for_embedding or account_for_loss):
        require(L % (p * v) == 0, "plan: pp x vpp", f"{p} x {v}",
                f"must divide num_layers {L} of {name} (pp x vpp of {divisors_text(L)} would); or split "
                "unevenly with --layer-split N,N,...|auto, --pipeline-model-parallel-layout, "
                "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers "
                "or --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split")
        return (L // (p * v),) * (p * v)
    if first is None and last is None:
        extra = int(account_for_embedding) + int(account_for_loss)
        total = L + extra
        field = " and ".join(f for f, on in ((EMB, account_for_embedding), (LOSS, account_for_loss)) if on)
        require(total % (p * v) == 0, f"plan: {field}", True,
                f"num_layers {L} + {extra} = {total} must be a multiple of pp x vpp = {p} x {v} = {p * v}; "
                f"pp x vpp of {divisors_text(total)} would divide")
        layers = [total // (p * v)] * (p * v)
        if account_for_embedding:
            layers[0] -= 1
        if account_for_loss:
            layers[-1] -= 1
        require(min(layers) >= 0, f"plan: {field}", True,
                f"the first/last virtual stage has no layer to give up ({total} layers over {p * v} stages)")
        return tuple(layers)
    n_first, n_last = first or 0, last or 0
    rest = L - n_first - n_last
    middle = p - (first is not None) - (last is not None)
    flag = FIRST if first is not None else LAST
    given = first if first is not None else last
    require(rest >= 0, f"plan: {flag}", given,
            f"first + last stage layers {n_first} + {n_last} exceed num_layers {L} of {name}")
    if middle == 0:
        require(rest == 0, f"plan: {flag}", given,
                f"with pp = {p} there are no middle stages, so first + last stage layers "
                f"({n_first} + {n_last}) must add up to num_layers {L}")
        per_mid = 0
    else:
        if rest % (middle * v):
            fixed = n_last if first is not None else n_first
            ok = [n for n in range(v, L - fixed + 1, v) if (L - fixed - n) % (middle * v) == 0]
            ok = sorted(sorted(ok, key=lambda n: abs(n - given))[:4])
            raise InputError(
                f"plan: {flag}: got {given!r}; the remaining {rest} of {L} layers must split evenly over "
                f"the {middle} middle stage(s){f' x vpp {v} chunks' if v > 1 else ''} "
                f"(a multiple of {middle * v}); {', '.join(map(str, ok)) or 'no value'} would divide")
        per_mid = rest // middle
    per_rank = [per_mid] * p
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    return tuple(per_rank[r] // v for _ in range(v) for r in range(p))


def parse_layer_split(value) -> tuple[int, ...] | str | None:
    """``--layer-split``: "10,10,12" as a tuple; "auto" as it is (``sim.session`` balances the
    stages once it knows their GPUs: ``sim.program.stage_balance``)."""
    if value is None or value == "auto":
        return value
    parts = [p.strip() for p in str(value).split(",")]
    require(all(p.isdigit() for p in parts), "--layer-split", value, setting="layer_split", allowed=
            "expected transformer layers per pipeline stage, integers separated by commas (10,10,12), or auto")
    return tuple(int(p) for p in parts)


# ------------------------------------------------------------------ layouts
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
"""``(ab|cd)*2``: a group repeated (Megatron-LM's first pattern; no nesting)."""
_CHAR = re.compile(r"(.)\*(\d+)")
"""``t*3``: one character repeated (its second pattern)."""


def _layout_error(text, allowed: str) -> InputError:
    return InputError(field=f"plan: {LAYOUT}", value=text, allowed=allowed, setting="pipeline_layout")


@lru_cache(maxsize=64)
def parse_layout(text: str) -> tuple[str, ...]:
    """The virtual stages of a layout string, each as its characters (module doc): commas
    dropped, ``(...)*N`` then ``x*N`` unrolled, split at ``|``. Only the characters
    E, t, m, L may remain."""
    require(isinstance(text, str) and text.strip() != "", f"plan: {LAYOUT}", text,
            "expected a layout string such as 'Et|tt|tL' (E embedding, t layer, m MTP layer, L loss; stages "
            "separated by |)", setting="pipeline_layout")
    s = text.replace(",", "").replace(" ", "")
    s = _GROUP.sub(lambda g: g.group(1) * int(g.group(2)), s)
    s = _CHAR.sub(lambda g: g.group(1) * int(g.group(2)), s)
    stages = tuple(s.split("|"))
    bad = sorted({c for st in stages for c in st if c not in LAYOUT_CHARS})
    if bad and set(bad) <= set("M*-"):  # a hybrid pattern's letters (Megatron-Core's Symbols)
        raise _layout_error(text, f"has {''.join(bad)!r}: Megatron-LM's layout names every decoder layer t, whatever "
                                  "its kind (the model says the kinds); a hybrid pattern's letters go in "
                                  "--hybrid-override-pattern, whose | places them on the stages")
    if bad:
        raise _layout_error(text, f"has {''.join(bad)!r} after unrolling; allowed: E (embedding), t (transformer "
                                  "layer), m (MTP layer), L (loss), | between stages, commas, (...)*N and x*N")
    return stages


def check_layout(plan) -> int:
    """The plan's own rules for ``plan.pipeline_layout`` (module doc; the counts that need the
    model are ``layout_layers``'s): E first, L last, the m layers with L, a stage count
    that is a multiple of pp, no other uneven option. Returns the vpp it sets."""
    text = plan.pipeline_layout
    stages = parse_layout(text)
    k, p = len(stages), plan.pp
    if k % p:
        raise _layout_error(text, f"has {k} stages; expected a multiple of pp = {p} (pp x vpp virtual stages)")
    flat = "".join(stages)
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        raise _layout_error(text, "E (the embedding) must come first, once, opening the first stage")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        raise _layout_error(text, "L (the loss) must come last, once, closing the last stage")
    if "m" in flat:
        if "t" in flat[flat.index("m"):]:
            raise _layout_error(text, "every m (MTP layer) must come after every t (transformer layer)")
        if flat.count("m") != stages[-1].count("m"):
            raise _layout_error(text, "the m (MTP) layers must all be in the last stage, with L (MTP on a stage "
                                      "of its own is not modelled)")
    others = _others(plan, LAYOUT)
    if others:
        raise _layout_error(text, f"cannot be combined with {', '.join(others)}")
    return k // p


def layout_layers(stages: tuple, num_layers: int, mtp_num_layers: int = 0, name: str = "the model") -> tuple:
    """Transformer layers of each virtual stage of a parsed layout, checked against the
    model: as many t as ``num_layers``, as many m as ``mtp_num_layers``."""
    flat = "".join(stages)
    text = "|".join(stages)
    n_t, n_m = flat.count("t"), flat.count("m")
    if n_t != num_layers:
        raise _layout_error(text, f"has {n_t} transformer layers (t); {name} has num_layers {num_layers}")
    if n_m != mtp_num_layers:
        raise _layout_error(text, f"has {n_m} MTP layers (m); {name} has mtp_num_layers {mtp_num_layers} "
                                  "(--mtp-num-layers)")
    return tuple(st.count("t") for st in stages)
