"""A follower rank of a tensor-parallel LMI-Dist engine (started by :class:`.distributed.FollowerGroup`)."""

from __future__ import annotations

import logging
import os


def main() -> int:
    from lmforge.process import freeze_startup_heap, pause_gc_for_startup

    # for the imports (loading.build turns it back on before the weights): a rank starts as the engine
    # core does, whose start it cuts by 1.1 CPU-s of 3.9 (lmforge.process.pause_gc_for_startup)
    pause_gc_for_startup()
    from lmforge.config import ServingConfig
    from lmforge.engines.lmi_dist.core import ignore_stop_signals
    from lmforge.engines.lmi_dist.distributed import CONFIG_ENV
    from lmforge.engines.lmi_dist.loading import build

    logging.basicConfig(
        level=logging.WARNING, format=f"rank {os.environ.get('RANK')} %(levelname)s %(message)s"
    )
    ignore_stop_signals()  # inherited from rank 0 already; this rank ends when rank 0 does
    config = ServingConfig.model_validate_json(os.environ[CONFIG_ENV])
    parent = os.getppid()
    built = build(config)
    from lmforge.engines.lmi_dist.speculative import install

    # every rank makes the same steps: the same drafts (a pure function of each request's tokens,
    # prompt lookup's or a whole draft model's greedy choices on every rank)
    install(built, config)
    freeze_startup_heap(collect=True)  # what the load made since the imports' freeze: small
    built.manager.start()
    thread = built.manager._generation_thread
    while thread is not None and thread.is_alive():
        thread.join(1.0)
        if os.getppid() != parent:  # rank 0 is gone: nothing left to follow
            os._exit(1)
    fatal = built.manager.background_thread_status.fatal_error
    return 1 if fatal is not None else 0


if __name__ == "__main__":
    from lmforge.process import run_main

    run_main(main)
