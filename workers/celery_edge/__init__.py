"""The Celery edge: every place unstuck subclasses, hooks or imitates Celery or kombu.

Elsewhere ``workers`` uses only Celery's public API (the app, ``send_task``, ``control.revoke``,
``events.default_dispatcher().send``) and catches billiard's ``SoftTimeLimitExceeded`` around a
tool (:mod:`workers.worker.calls`). Three modules here lean on an internal, one per Celery or
kombu class extended or imitated: ``consumer.py``, ``messages.py`` and ``sentinel_transport.py``
(why no public API does each: docs/architecture.md);
``unit/test_celery_internals.py`` fails first when a release renames or drops one. What each
module relies on, and the test that pins its behaviour (under ``tests/``):

``app.py``: the app of each role (``celery -A workers.celery_edge.app``, ``...app:control_app``)
    - ``conf.worker_consumer`` names the consumer class; ``app.steps["worker"|"consumer"].add``
      adds bootsteps; ``include`` names the task modules (``tasks.invoke``, ``tasks.control``),
      never imported from here. Pinned by every worker the integration tests start (they run
      ``-A workers.celery_edge.app``) and ``unit/test_control_queue.py``.
``app_config.py``: our settings as Celery setting names (a leaf: the gateway's sending app)
    - ``worker_disable_prefetch``, on only when ``worker.give_back_after_ms`` is 0 (a worker
      without a free slot takes no message): ``unit/test_celery_config_brokers.py``; kombu's
      Redis transport option ``ack_emulation`` (off: no ``unacked`` bookkeeping; public, no
      subclass): ``integration/test_broker_acks.py``.
``consumer.py``: ``RefusingConsumer``, which counts refused messages, survives hostile bodies,
  reconnects within a second and batches its task events
    - ``celery.worker.consumer.Consumer.create_task_handler``, ``on_decode_error``,
      ``on_invalid_task``, ``connection_errors`` / ``channel_errors``:
      ``integration/test_forged_messages.py``, ``integration/test_signed_messages.py``;
      ``ensure_connected``: ``unit/test_broker_reconnect.py``; ``on_send_event_buffered`` (the
      ``Events`` step's ``on_send_buffered``), ``event_dispatcher``, ``hub.call_later``,
      ``on_close``, ``stop``, ``shutdown``: ``integration/test_task_events.py`` (Celery's own
      dispatcher), ``unit/test_consumer_events.py``. Kept for its measured gain
      (docs/architecture.md): 21 Redis commands per call instead of 25, 0.7 CPU ms per call in
      the worker's main process instead of 1.2.
``request.py``: ``GuardedRequest``, the invoke task's request class (``Task.Request``)
    - public API only: the hooks Celery documents for a request class, ``on_timeout``,
      ``on_failure`` (with its ``send_failed_event``) and ``on_accepted``, and the request's
      ``send_event``, ``kwargs``, ``worker_pid``, ``time_start``: ``integration/test_backbone.py``
      (hard limit, crashed child), ``e2e/test_flower.py`` (each task closed in the state of its
      call's answer), ``unit/test_guarded_request.py`` (the hooks' shapes, billiard's order on a
      hard limit), ``integration/test_held_messages.py`` (``on_accepted``).
``bootsteps.py``: ``PoolGuard`` and ``LeaseKeeping``, in the tool worker's main process
    - public API only: ``bootsteps.Step`` built with the worker and its ``pool_cls``, signals:
      ``integration/test_worker_start.py``; the keeper watches the jobs the pool children write
      into their slots (:mod:`workers.worker.child_slots`, each at billiard's process ``index``,
      Celery's ``%I``): ``integration/test_backbone.py`` (silent heartbeat),
      ``integration/test_cancellation.py``.
``give_back.py``: ``GiveBack``, which publishes again the messages the worker took ahead and no
  pool child started within ``worker.give_back_after_ms`` (:mod:`workers.worker.held_messages`)
    - public API only: a worker bootstep, the ``task_received`` signal, the request's
      ``message`` (its ``body``, ``headers``, ``properties``, ``delivery_info``) and a kombu
      producer's ``publish``: ``integration/test_held_messages.py``,
      ``e2e/test_backbone_e2e.py``.
``child_exits.py``: ``ChildExits``, which runs the pool's upkeep on SIGCHLD (Celery's sentinel can
  fire before a dead child can be reaped, leaving it to a 5 s timer)
    - public API only: a worker bootstep, the hub's ``add_reader``, ``pool.maintain_pool`` and
      the ``worker_process_init`` signal: ``integration/test_child_exits.py``.
``messages.py``: the invoke message as the Redis transport stores it, built without ``send_task``
    - ``app.amqp.as_task_v2``, ``app.thread_oid`` and kombu's Redis envelope (base64 body,
      ``delivery_info``, ``delivery_tag``): ``integration/test_task_messages.py`` compares it with
      what ``send_task`` pushes; its ``kwargsrepr`` is ``celery.utils.saferepr``'s text, built
      without the token stream: ``unit/test_task_messages_repr.py`` compares the two.
``task_events.py``: the task events of answers written outside a task, and the gateway's task-sent
    - public API only: ``app.producer_pool`` and ``app.events.Dispatcher`` built with its documented
      ``buffer_group`` / ``buffer_limit`` arguments and ``flush()`` (one ``task.multi`` message per
      batch): ``integration/test_task_events.py`` (Celery's receiver).
``sentinel_transport.py``: kombu's Sentinel transport kept on the primary the Sentinels name now
    - kombu's ``SentinelChannel._sentinel_managed_pool``, the event loop cycle's ``_channels``,
      ``kombu.transport.TRANSPORT_ALIASES`` and its private ``_transport_cache``:
      ``integration/test_sentinel_failover.py``, ``unit/test_sentinel_url.py``.
``names.py``: the task names and ids (plain strings; no internal).
``message_signing.py``: Celery's own message signing (``broker.signing``), public API only
    - ``setup_security`` and the ``auth`` serializer: ``integration/test_signed_messages.py``,
      ``unit/test_message_signing.py``.

The worker's own logic (claim, refuse, run, answer by the deadline, answer lost children)
is in :mod:`workers.worker`; these classes only hand it what Celery holds.
"""
