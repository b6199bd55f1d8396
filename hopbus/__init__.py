"""hopbus: heterogeneity-aware decentralized training (Hop, ASPLOS'19), as a message-broker
pipeline."""

__version__ = "0.1.0"
