"""The related synchronization schemes (parameter server, ElasticBSP, WAGMA-SGD) on hopbus's
engine."""
