"""Token ids <-> SNAC codes: round trips, phase checks, code 0, the level layout, prompts."""

from __future__ import annotations

import numpy as np
import pytest

from tts_service.orpheus import tokens as T


def test_ids_round_trip_every_position_and_edge_code():
    for k in range(7):
        for code in (0, 1, 2047, 4095):
            tid = T.audio_id(code, k)
            assert T.code_of(tid, k) == code
    assert T.audio_id(0, 0) == 128266  # <custom_token_10>
    assert T.audio_id(4095, 6) == T.AUDIO_END - 1


def test_frame_round_trip_keeps_code_zero():
    codes = [0, 0, 4095, 0, 17, 0, 4095]
    assert T.frame_codes(T.frame_ids(codes)) == codes


@pytest.mark.parametrize(
    "token,k",
    [
        (T.audio_id(5, 1), 0),  # a position-1 token where position 0 is due
        (T.audio_id(5, 0), 6),
        (T.AUDIO_BASE - 1, 0),  # the last special token before the audio range
        (T.END_OF_SPEECH, 0),
        (T.AUDIO_END, 6),  # one past the last audio id
        (1000, 3),  # a text token
    ],
)
def test_out_of_phase_and_non_audio_ids_are_rejected(token, k):
    with pytest.raises(T.PhaseError):
        T.code_of(token, k)


def test_a_shifted_frame_is_rejected_not_reinterpreted():
    ids = T.frame_ids([1, 2, 3, 4, 5, 6, 7])
    with pytest.raises(T.PhaseError):
        T.frame_codes(ids[1:] + ids[:1])


def test_levels_layout_matches_snac_hierarchy():
    # frame = (l0, l1a, l2a, l2b, l1b, l2c, l2d): depth first through the 3 levels
    frames = np.array([[10, 11, 12, 13, 14, 15, 16], [20, 21, 22, 23, 24, 25, 26]])
    l0, l1, l2 = T.frames_to_levels(frames)
    assert l0.tolist() == [10, 20]
    assert l1.tolist() == [11, 14, 21, 24]
    assert l2.tolist() == [12, 13, 15, 16, 22, 23, 25, 26]
    assert T.levels_to_frames(l0, l1, l2).tolist() == frames.tolist()
    batch = np.stack([frames, frames + 100])
    b0, b1, b2 = T.frames_to_levels(batch)
    assert b0.shape == (2, 2) and b1.shape == (2, 4) and b2.shape == (2, 8)
    assert b2[1].tolist() == (l2 + 100).tolist()


def test_prompt_layout():
    class Fixed:
        def encode_ids(self, text):
            assert text == "tara: Hello."
            return [9, 8, 7]

    ids = T.build_prompt(Fixed(), "Hello.", "tara")
    assert ids == [128259, 128000, 9, 8, 7, 128009, 128260, 128261, 128257]


def test_hash_tokenizer_is_word_sized_and_in_text_range():
    ids = T.HashTokenizer().encode_ids("Hello there, how are you?")
    assert len(ids) == 7  # 5 words and 2 marks: about what a BPE tokenizer gives
    assert all(0 <= i < 128000 for i in ids)
