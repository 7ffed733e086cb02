"""What is specific to one front: the threading and asyncio queues and their runners."""
