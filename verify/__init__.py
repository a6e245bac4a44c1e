"""``txbroker verify``: a Jepsen-style checker of txbroker's guarantees under faults.

A verify run starts a real cluster whose nodes each live in their own Linux network
namespace on a bridge (``verify.netns``), drives faults into it while a workload writes and
reads (``verify.nemesis``: partitions made of silent packet drops, SIGKILL and restart,
SIGSTOP and SIGCONT), records every operation and fault in a history, and checks the
history against the model (acknowledged records survive exactly once, in order; committed
transactions appear atomically, aborted ones never). The client side of every operation
runs in the root namespace and reaches every node at all times: faults cut nodes from each
other, never from the client.
"""
