"""NCCL's tuning model for small and mid-size messages: channels, protocol caps, NVLS chunks.

NCCL prices each (algorithm, protocol) as ``latency + size / bandwidth`` (``ncclTopoTuneModel``
and ``ncclTopoGetAlgoTime`` in NVIDIA/nccl ``src/graph/tuning.cc``), then runs the winner on
as many channels as the size keeps busy (``topoGetAlgoInfo`` in ``src/enqueue.cc``) and, for
NVLS, cuts the buffer into chunks that go through the switch as a pipeline
(``calcCollChunking`` in ``src/enqueue.cc``). trainsim's collectives are flows on the
topology (``sim.engine.collectives``): the links give the large-message bandwidth and the
protocols' wire overheads (``sim.engine.nccl``). This module adds what NCCL's model has on
top of the links, as rate caps on a collective's transfers and a lead on NVLS's second half:

- **Channels for the size.** A communicator has ``C`` channels (one thread block each); a
  ring or tree collective keeps ``nc`` of them, dropping one while
  ``nBytes < nc · nThreads · threadThreshold`` (``topoGetAlgoInfo``): threads
  ``NCCL_SIMPLE_MAX_NTHREADS`` = ``NCCL_LL_MAX_NTHREADS`` = 512, ``NCCL_LL128_MAX_NTHREADS``
  = 640 (``src/include/device.h``); per-thread thresholds ``NCCL_LL_THREAD_THRESHOLD`` 8 (×
  nRanks for ring), ``NCCL_LL128_THREAD_THRESHOLD`` 8, ``NCCL_SIMPLE_THREAD_THRESHOLD`` 64
  bytes (``src/include/comm.h``, ``ncclTopoTuneModel``). Each channel moves 1/C of what the
  links carry, so a transfer runs at most at ``nc / C`` of its route's bottleneck. NVLS
  always runs ``nvlsChannels`` (16 on Hopper, ``NVLS_NCHANNELS_SM90``).
- **Protocol and algorithm caps** (``ncclTopoTuneModel``'s "model refinements", bus
  bandwidth, GB/s, by architecture and node count N1/N2/N4+): ring LL at most ``llMaxBws``
  (one node: by GPU, Hopper 141; more nodes: by CPU, Intel 39/20.4, AMD 22.5/19);
  ring LL128 at most ``nChannels · perChMaxRingLL128Bws`` (Hopper 36.7 per channel); tree
  all-reduce Simple ``0.92 · busBw`` and at most ``nChannels · perChMaxTreeBws`` (Hopper
  38.7/41.4/36.0), tree LL ``busBw / 3.8`` and at most ``llMaxBw``, tree LL128
  ``busBw · 7/9`` on one node (120/128 across nodes) and at most ``nChannels ·
  perChMaxTreeLL128Bws``; the tree's measured ``treeCorrectionFactor`` by size (64 B to
  256 MiB, ``ncclTopoGetAlgoTime``). ``nChannels`` there is the topology search's, half
  the communicator's (sjeaugey, NVIDIA/nccl#1041: "Execution channels are typically 2x
  the search channels"); with ``nc`` of ``C`` channels running, the per-channel caps scale
  by ``nc / C``. The ring's LL (×0.5) and LL128 (×0.92) factors are the protocols' wire
  overheads already (``sim.engine.nccl``); a tree's factors are taken relative to them.
- **Per-step latencies.** Every step of a ring, tree or NVLS-tree pays NCCL's
  ``hwLatencies`` for its algorithm, protocol and medium (``HW_LATENCY_S``; a ring all-reduce
  inside one node 2(n−1) · 3.4 µs under Simple, a tree 2(n−1) · 4.0 µs), instead of the
  topology's link latencies, after the base latency ``baseLatencies`` (``sim.engine.nccl``).
- **NVLS chunks.** NVLS moves the buffer in chunks of ``nvlsChunkSize`` (128 KiB), cut to
  64, 32 or 16 KiB when ``nBytes`` is under 64, 8 or 2 times ``concurrentOps · chunk``,
  ``concurrentOps = nvlsChannels · nHeads`` (one head per GPU of the node); a chunk is
  reduced by the switch (multimem.ld_reduce) before it is multicast back (multimem.st), so
  the way back starts one round of chunks (``concurrentOps · chunk`` bytes, at most the
  whole send) after the way out: small and mid-size messages pay it as latency
  (``sim.engine.algorithms_nccl``).

Communicator channels: 24 on one 8-GPU H100 or A100 node, 16 NVLS channels (NCCL INFO
"24 coll channels, 16 nvls channels" on a p5.48xlarge, aws-samples awsome-distributed-training
nccl-tests; "24 coll channels ... 0 nvls channels" on 8 A100), 16 across H100 nodes
("16 coll channels, 16 collnet channels, 16 nvls channels" on 3 × 8 H100, NVIDIA/nccl#1453).

These apply with a hardware profile of a known architecture (``NcclModel.arch``); without
one (hand-written topologies at line rate) collectives are the links' closed forms alone.
"""

from __future__ import annotations

import math

NCCL_ENQUEUE = "NVIDIA/nccl src/enqueue.cc (topoGetAlgoInfo, calcCollChunking)"

THREADS = {("ring", "ll"): 512, ("ring", "ll128"): 640, ("ring", "simple"): 512,
           ("tree", "ll"): 512, ("tree", "ll128"): 640, ("tree", "simple"): 512}
"""comm->maxThreads[algo][proto]: NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS,
NCCL_SIMPLE_MAX_NTHREADS (device.h; ring Simple 256 only below PCI bandwidth)."""
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}
"""Bytes per thread before NCCL adds a channel (comm.h NCCL_*_THREAD_THRESHOLD; ring LL × nRanks)."""

ARCH_OF_GPU = {"h100": ("hopper", "intel"), "h200": ("hopper", "intel"), "a100": ("ampere", "amd"),
               "b200": ("blackwell", "intel"), "gb200": ("blackwell", "intel"),
               "gb300": ("blackwell", "intel")}
"""Profile name prefix -> (GPU architecture, the DGX's CPU vendor: DGX H100/H200 Xeon 8480C,
DGX A100 EPYC 7742, DGX B200 Xeon 8570; GB200's Grace is Arm, which NCCL reads from the same
row as Intel, its index1 being 1 for AMD only); NCCL indexes its tables by both."""

LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0),
             "blackwell": (282.0, 90.0, 70.0)}
"""llMaxBws for one node (first entry, by GPU) in GB/s; across nodes NCCL reads the CPU's row
instead (``LL_MAX_BW_CPU``)."""
LL_MAX_BW_CPU = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
"""llMaxBws rows 0 (Intel) and 1 (AMD) for N2 and N4+ (index1 = CPU vendor when nNodes > 1)."""
PER_CH_RING_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 36.7),
                     "blackwell": (40.0, 40.0, 40.0)}
PER_CH_TREE = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0),
               "blackwell": (70.0, 42.8, 24.0)}
PER_CH_TREE_LL128 = {"volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0), "hopper": (36.7, 36.7, 29.0),
                     "blackwell": (55.6, 31.67, 20.0)}
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
"""treeCorrectionFactor[proto][log2(nBytes / 64)] (tuning.cc; applied to log sizes 0..22)."""

HW_LATENCY_S = {
    "ring": {"nvlink": {"ll": 0.6e-6, "ll128": 1.9e-6, "simple": 3.4e-6},
             "pci": {"ll": 1.0e-6, "ll128": 2.5e-6, "simple": 5.7e-6},
             "net": {"ll": 2.7e-6, "ll128": 4.0e-6, "simple": 14.0e-6}},
    "tree": {"nvlink": {"ll": 0.6e-6, "ll128": 1.25e-6, "simple": 4.0e-6},
             "pci": {"ll": 1.0e-6, "ll128": 1.9e-6, "simple": 4.0e-6},
             "net": {"ll": 5.0e-6, "ll128": 8.5e-6, "simple": 14.0e-6}},
    "nvls_tree": {"net": {"ll": 0.0, "ll128": 0.0, "simple": 20.9e-6}},
}
"""hwLatencies[NVLINK|PCI|NET][algo][LL, LL128, Simple] (tuning.cc, µs -> s): the latency of
one step of an algorithm on that hardware (ring's NVLink and network rows are also the
profile's ``nccl_protocols``, which the engine reads for ring). NVLS-tree's network row is
its tree hops across nodes; NVLS's own 25 µs is ``nvls_latency_s``."""

CHANNELS_ONE_NODE = 24
CHANNELS_NODES = 16
NVLS_CHANNELS = 16
"""NVLS_NCHANNELS_SM90 (src/transport/nvls.cc, ncclNvlsTuning)."""
NVLS_CHUNK_BYTES = 128 * 1024
"""NCCL_NVLS_CHUNKSIZE's default (src/transport/nvls.cc)."""


def _node_index(nodes: int) -> int:
    """NCCL's index2: N1, N2, N4+ (``nNodes <= 2 ? nNodes - 1 : 2``)."""
    return min(nodes, 3) - 1


def comm_channels(nodes: int) -> int:
    """Channels of a communicator over ``nodes`` nodes (module doc)."""
    return CHANNELS_ONE_NODE if nodes == 1 else CHANNELS_NODES


def channels_used(algo: str, protocol: str, nbytes: float, nranks: int, nodes: int) -> tuple[int, int]:
    """(nc, C): the channels NCCL runs ``algo``/``protocol`` on for ``nbytes`` and the
    communicator's. Ring and tree: ``topoGetAlgoInfo``'s loop ``while (nBytes < nc * nt *
    threadThreshold && nc >= 2) nc--``; NVLS: all its channels."""
    if algo.startswith("nvls"):
        return NVLS_CHANNELS, NVLS_CHANNELS
    c = comm_channels(nodes)
    threshold = THREAD_THRESHOLD[protocol] * (nranks if (algo, protocol) == ("ring", "ll") else 1)
    per_channel = THREADS[(algo, protocol)] * threshold
    nc = c
    while nbytes < nc * per_channel and nc >= 2:
        nc -= 1
    return nc, c


def tree_correction(protocol: str, nbytes: float) -> float:
    """NCCL's ``treeCorrectionFactor`` for a tree all-reduce of ``nbytes`` (1 outside 64 B..256 MiB)."""
    log = int(nbytes) >> 6
    if log < 1:
        return 1.0
    i = log.bit_length() - 1
    return TREE_CORRECTION[protocol][i] if i < 23 else 1.0


def bus_cap_Bps(arch: str, cpu: str, algo: str, protocol: str, nodes: int, nc: int, c: int) -> float:
    """The bus bandwidth (B/s) NCCL's model allows ``algo``/``protocol`` on ``nc`` of ``c``
    channels over ``nodes`` nodes, beyond the links (module doc); inf where it sets none."""
    i = _node_index(nodes)
    ll_max = (LL_MAX_BW[arch] if nodes == 1 else LL_MAX_BW_CPU[cpu])[i]
    search = c / 2 * nc / c  # the search graph's channels, as many of them as run
    cap = math.inf
    if algo == "ring" and protocol == "ll":
        cap = ll_max
    elif algo == "ring" and protocol == "ll128":
        cap = search * PER_CH_RING_LL128[arch][i]
    elif algo == "tree" and protocol == "simple":
        cap = search * PER_CH_TREE[arch][i]
    elif algo == "tree" and protocol == "ll":
        cap = ll_max
    elif algo == "tree" and protocol == "ll128":
        cap = search * PER_CH_TREE_LL128[arch][i]
    return cap * 1e9


def tree_factor(protocol: str, nodes: int, wire_fraction: float) -> float:
    """What a tree all-reduce reaches of the links under ``protocol`` beyond the protocol's
    wire overhead ``wire_fraction`` (``sim.engine.nccl``): NCCL's tree refinements, Simple
    0.92, LL 1/3.8, LL128 7/9 on one node and 120/128 across nodes, over the wire fraction."""
    f = {"simple": 0.92, "ll": 1 / 3.8, "ll128": 7 / 9 if nodes == 1 else 120 / 128}[protocol]
    return min(1.0, f / wire_fraction)


def nvls_chunk_bytes(nbytes: float, heads: int) -> int:
    """``calcCollChunking``'s NVLS chunk for ``nbytes`` with ``heads`` heads: 128 KiB, cut to
    64/32/16 KiB below 64/8/2 rounds of ``concurrentOps = NVLS_CHANNELS · heads`` chunks."""
    ops = NVLS_CHANNELS * heads
    chunk = NVLS_CHUNK_BYTES
    if nbytes < 64 * ops * chunk and chunk > 65536:
        chunk = 65536
    if nbytes < 8 * ops * chunk and chunk > 32768:
        chunk = 32768
    if nbytes < 2 * ops * chunk and chunk > 16384:
        chunk = 16384
    return chunk


def nvls_lead_bytes(nbytes: float, heads: int, up_bytes: float) -> float:
    """Bytes a GPU sends to the switch before the first multicast comes back: one round of
    chunks over all channels and heads, at most all it sends (module doc)."""
    return min(NVLS_CHANNELS * heads * nvls_chunk_bytes(nbytes, heads), up_bytes)
