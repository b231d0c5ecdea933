"""The conversation in the window: the message column, the composer, the list of conversations and
the controller that streams a reply into them and saves it."""
