"""What the bench says. Durations are of the bundled en_US-joe-medium voice (measured, +-5 %)."""

from __future__ import annotations

SHORT = "Happy to help."  # ~0.95 s
LONG = "I found three flights to Denver tomorrow morning, and the earliest one leaves at seven fifteen."  # ~5.0 s
# Extra lengths for the TTFB-vs-length plot only (first byte measured, the rest cancelled).
SWEEP = (
    "Your table for four is booked for Friday at eight.",  # ~2.4 s
    "Your order has shipped and should arrive on Thursday. Is there anything else I can help you with today? "
    "I can also set up delivery notifications by text message, or send you a reminder the day before it "
    "arrives, whichever you prefer.",  # ~12 s
)

# Mid-stream input update: the second piece arrives 200 ms after the first.
SPLIT = ("Sure, I can move your appointment", " to Thursday at three in the afternoon.")
# Words only the second piece holds; a tuple lists spellings Whisper may choose ("3" for "three").
SPLIT_CHECK_WORDS: tuple[str | tuple[str, ...], ...] = ("thursday", ("three", "3"), "afternoon")

# Load: what a voice agent says in a turn (1-6 s each), cycled with a per-agent offset.
TURNS = (
    "Sure, I can move your appointment to Thursday at three in the afternoon.",
    "Let me check that for you.",
    "Of course. Your current balance is two hundred and fourteen dollars.",
    "I'm sorry, I didn't catch that. Could you say it again?",
    "Great, I've sent the confirmation to your email address.",
    "Okay, got it.",
    "The clinic opens at eight thirty on weekdays and at ten on Saturdays.",
    "Thanks for waiting. I have two options for you: a window seat in row twelve, or an aisle seat near the front.",
    "Yes, that works. Do you want me to add a reminder?",
    "Your table for four is booked for Friday at eight.",
)
