"""Planning: orders and priorities for the transfers of a training iteration (TicTac's TIC
and TAC, Caramel), DDP bucket advice and the analytic PS / P2P / ring models."""
