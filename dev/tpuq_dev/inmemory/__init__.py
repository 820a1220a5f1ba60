"""In-memory stand-ins for the clients the services hold: Firestore and the Pub/Sub publisher.

Port stubs, like Dramatiq's StubBroker: they take the google-cloud clients'
call shapes, so handler code runs on them unchanged. The tests use them to run
the services' handlers without emulators, and the fleet simulator will run the
whole system on them. No service module imports this package (a test of the
import graph checks it): production talks to Google Cloud, the local stack to
the emulators, and `tests/contract/` proves this store and the Firestore
emulator agree on every operation the services use.
"""

from tpuq_dev.inmemory.firestore import MemoryFirestore
from tpuq_dev.inmemory.pubsub import MemoryPublisher, PublishedMessage

__all__ = ["MemoryFirestore", "MemoryPublisher", "PublishedMessage"]
