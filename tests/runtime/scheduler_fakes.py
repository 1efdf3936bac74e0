"""The scheduler's effects as a log, for tests that drive it synchronously."""


class FakeEffects:
    def __init__(self):
        self.log = []

    def start(self, ticket, replica):
        self.log.append(("start", ticket.request_id, replica))

    def reject(self, ticket, error):
        self.log.append(("reject", ticket.request_id, error.code))
