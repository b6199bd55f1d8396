"""The related synchronization schemes (parameter server, ElasticBSP, WAGMA-SGD) on hopbus's
engine, and the ring all-reduce baseline (torch.distributed) next to them."""
