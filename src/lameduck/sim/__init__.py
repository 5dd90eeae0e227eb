"""``lameduck simulate``: a whole fleet's drain or rolling update in virtual time.

The drain decisions are the drain core's (``lameduck.drain``): every instance runs a real
``ProcessDrain`` with its ``ListenerDrain``, ledger and preStop FSM; the per-connection draws
(the proactive moment, the gradual ramp, the client backoff) are vectorised forms of the core's
functions, tested equal to them draw for draw (``draws.py``, ``walk.py``). What is modelled
around them (clients, the load balancer, the rollout) is described in docs/simulate.md.
"""
