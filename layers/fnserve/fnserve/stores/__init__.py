"""Result stores beside the AWS ones: Redis (Memorystore, or a container server's neighbour)."""
