"""The passes ``Program -> Program``, one module each (or one family): what ``transforms``
exports and ``transforms.named_passes()`` lists. Imports nothing itself: import a pass from
``transforms`` (or its module here)."""
