"""``asynctier bench``: the main job, measured against the machine.

It fills a primary buffer (a torch tensor when torch is installed, pinned when CUDA is
available) with random bytes, then for every tier, chunk size and depth:

1. **offload**: one ``offload`` call with every chunk of the point, the tier built with
   ``max_inflight=depth`` (so ``depth`` chunk I/Os are in flight, as fio's ``iodepth``), timed
   until the bytes are on the medium (a ``syncfs`` inside the timed window);
2. **lookup**: one call with every stored key and one with as many absent keys;
3. **load**: one call, from a cold page cache, into *other* slots than the ones offloaded
   from, after zeroing the buffer;
4. **verify**: every byte loaded is compared with what was offloaded;
5. **latency**: ``depth`` callers, each awaiting one-chunk ``offload`` (then ``load``) calls
   back to back, on a few more chunks: the p50/p99 a caller waiting for one chunk sees.
   These are loaded and verified too.

Before each timed write (the tiers', fio's, the naive loop's) the device is let settle
(:func:`asynctier.cli.benchkit.settle`): on a file system mounted with ``discard``, the
deletes of the previous point leave work that would otherwise land on whoever writes next.
In the same run and on the same file system it measures fio (same block size and depth,
O_DIRECT) and a naive aiofiles loop (one file per chunk), and reports the tiers' throughput
as ratios of both.

Modules: :mod:`.plan` (what runs, what it moves, how long it may take), :mod:`.primary`
(the buffer), :mod:`.point` (one tier at one point), :mod:`.references` (fio, the naive
loop), :mod:`.runner` (the sweep), :mod:`.results` (figures, medians, ratios),
:mod:`.tables` and :mod:`.outputs` (terminal, JSON, markdown, PNG), :mod:`.progress` (the
bar), :mod:`.command` (the click command). Nothing here is imported by ``import asynctier``.
"""
