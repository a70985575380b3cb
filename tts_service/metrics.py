"""Prometheus metrics of one server instance.

Each server gets its own registry so that several servers in one process (tests, the bench's
baseline beside the streaming server) do not collide; ``process_*`` series come along so a
scraper (and ``streamvox bench load``) can read the server's CPU time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.ttfb = Histogram(
            "streamvox_ttfb_seconds",
            "First text received to first audio frame sent",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cancel_ack = Histogram(
            "streamvox_cancel_ack_seconds",
            "Cancel received to ack sent",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=r,
        )
        self.active = Gauge("streamvox_active_streams", "Streams not yet finished", registry=r)
        self.queue_depth = Gauge("streamvox_queue_depth", "Text segments waiting for synthesis", registry=r)
        self.batch_size = Histogram(
            "streamvox_batch_size", "Vocoder windows per worker call", buckets=(1, 2, 3, 4, 6, 8, 12, 16), registry=r
        )
        self.batch_seconds = Histogram(
            "streamvox_batch_seconds", "Worker time per scheduling tick", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.rtf = Gauge("streamvox_real_time_factor", "Compute seconds per audio second (moving average)", registry=r)
        self.capacity = Gauge("streamvox_capacity_streams", "Real-time streams the measured cost allows", registry=r)
        self.audio_seconds = Counter("streamvox_audio_seconds", "Audio sent", registry=r)
        self.busy_seconds = Counter(
            "streamvox_worker_busy_seconds", "Time the inference worker spent computing", registry=r
        )
        self.streams = Counter("streamvox_streams", "Finished streams by outcome", ["status"], registry=r)
        self.errors = Counter("streamvox_errors", "Error messages sent, by code", ["code"], registry=r)
        self.batches_aborted = Counter(
            "streamvox_batches_aborted", "Running batches stopped because all their streams were cancelled", registry=r
        )
        self.frames_dropped = Counter(
            "streamvox_frames_dropped", "Computed frames never sent because of a cancel", registry=r
        )
        self.load = Gauge(
            "streamvox_load",
            "Share of the admission budget in use, 0..1 (1: new streams are refused); for placement and autoscaling",
            registry=r,
        )
        self.draining = Gauge("streamvox_draining", "1 while the server drains for shutdown", registry=r)
        self.connections = Gauge("streamvox_connections", "Open WebSocket connections", registry=r)
        self.connections_closed = Counter(
            "streamvox_connections_closed",
            "WebSocket connections the server closed, by reason (not_reading, too_big, drained)",
            ["reason"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
