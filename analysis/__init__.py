"""Analysis package: pcap reading, packet matching and metrics."""
