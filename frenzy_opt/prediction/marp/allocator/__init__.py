"""A model of PyTorch's CUDA caching allocator (the native backend of ``c10/cuda/CUDACachingAllocator.cpp``),
replaying allocation traces without a GPU.

* :mod:`~frenzy_opt.prediction.marp.allocator.sizes` — the allocator's constants, request rounding and
  segment sizes;
* :mod:`~frenzy_opt.prediction.marp.allocator.config` — the ``PYTORCH_CUDA_ALLOC_CONF`` settings modelled,
  and their parser;
* :mod:`~frenzy_opt.prediction.marp.allocator.pools` — segments, blocks, the pools of cached blocks per
  stream, merging a freed block with its free neighbours;
* :mod:`~frenzy_opt.prediction.marp.allocator.expandable` — expandable segments' page mapping;
* :mod:`~frenzy_opt.prediction.marp.allocator.model` — the allocator state machine
  (:class:`~frenzy_opt.prediction.marp.allocator.model.CachingAllocatorModel`) and its statistics;
* :mod:`~frenzy_opt.prediction.marp.allocator.replay` — allocation traces (``MemEvent``) and their replay.
"""
