"""The bucket server: one process owns one partition's leaky buckets.

``partition`` is the sans-I/O core (datagram in, reply out, time passed in);
``udp`` is the thin asyncio adapter that adds sockets, the store and a clock.
"""
