"""The real-length script: 40 sentences of 1 to 30 s in seven languages, each with a fixed frame count.

Random checkpoints never emit a meaningful EOS, so every sentence is given the length natural speech would
have: about 2.7 words per second (space-separated languages) or 4.5 characters per second (Chinese and
Japanese), at 12.5 codec frames per second.
"""
from __future__ import annotations

import re

FPS = 12.5
WORDS_PER_S = 2.7
CJK_PER_S = 4.5
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff]")

SCRIPT = [  # (language, text), in the order the bench runs them
    ("English", "Thank you, Anna."),
    ("Chinese", "好的，明天见。"),
    ("English", "The train leaves at seven tomorrow morning."),
    ("German", "Guten Morgen, wie geht es dir heute?"),
    ("Chinese", "今天的天气很好，我们一起去公园散步吧。"),
    ("English", "Could you please send me the report before the meeting starts this afternoon?"),
    ("French", "Je voudrais réserver une table pour deux personnes ce soir, près de la fenêtre si possible."),
    ("Japanese", "駅までの道を教えていただけますか。"),
    ("English", "Yes."),
    ("Spanish", "El museo abre a las diez y cierra a las seis, pero los lunes está cerrado todo el día."),
    ("Chinese", "这个项目下周一必须完成，请大家抓紧时间，有问题随时和我联系。"),
    ("English", "When the storm finally passed, the villagers walked down to the harbour to count the boats that "
                "had survived the night, and to their surprise every single one was still there."),
    ("Korean", "안녕하세요, 오늘 회의는 오후 세 시에 시작합니다."),
    ("English", "Press the green button twice, wait for the light to turn blue, and then hold the lever down."),
    ("Chinese", "小时候，我最喜欢在夏天的傍晚坐在院子里，听爷爷讲他年轻时在山里打猎的故事，那些故事到现在我还记得清清楚楚。"),
    ("German", "Die Ausstellung zeigt mehr als zweihundert Gemälde aus drei Jahrhunderten, darunter viele Werke, "
               "die noch nie öffentlich zu sehen waren."),
    ("English", "Good night."),
    ("English", "Our quarterly results show steady growth in every region, with the strongest gains coming from "
                "the new subscription service that we launched in the spring, and we expect this trend to continue "
                "through the end of the year as more customers move from the older plans."),
    ("Japanese", "明日の会議は午後二時から始まりますので、資料を忘れずに持ってきてください。"),
    ("French", "Merci beaucoup."),
    ("Chinese", "请注意，列车即将进站。"),
    ("English", "The recipe is simple: two cups of flour, one egg, a pinch of salt, and enough milk to make a "
                "smooth batter."),
    ("Spanish", "Hola, ¿cómo estás?"),
    ("English", "Long before the first maps were drawn, sailors found their way across the open sea by reading "
                "the stars, the colour of the water, the flight of birds and the shape of the waves, and they "
                "passed this knowledge from one generation to the next through songs and stories that children "
                "learned by heart long before they ever set foot on a ship."),
    ("Chinese", "根据最新的调查结果，超过百分之六十的受访者表示，他们每天至少花两个小时使用手机，其中大部分时间用于浏览社交媒体和观看短视频。"
                "专家建议，大家应该合理安排时间，多参加户外活动，保护好自己的视力和身体健康。"),
    ("English", "I'm on my way."),
    ("German", "Vielen Dank für Ihre Geduld. Ihr Anruf ist uns wichtig, und der nächste freie Mitarbeiter wird "
               "sich in Kürze um Ihr Anliegen kümmern."),
    ("Korean", "감사합니다."),
    ("English", "Please remember to water the plants on the balcony while I am away, especially the tomatoes, "
                "which need a lot more water when the weather is hot."),
    ("Chinese", "欢迎收听今天的节目。"),
    ("Japanese", "ありがとうございます。"),
    ("English", "In the beginning the company had only three employees, a borrowed garage and an idea that most "
                "investors thought would never work, yet within ten years it had grown into one of the largest "
                "employers in the region, with offices on four continents and a product used by millions of "
                "people every single day, and the founders still insist, with a smile, that the small garage "
                "behind the old bakery was the best office they ever had."),
    ("French", "La réunion de demain est reportée à jeudi matin, à neuf heures, dans la grande salle du "
               "deuxième étage."),
    ("Chinese", "春天来了，山坡上的桃花和杏花都开了，远远看去像一片粉红色的云。孩子们在田野里放风筝，老人们坐在树下喝茶聊天，"
                "整个村子都沉浸在温暖的阳光里。到了傍晚，炊烟从一家家的屋顶升起，空气里飘着饭菜的香味。"),
    ("English", "Stop."),
    ("Spanish", "Si necesitas ayuda con el proyecto, no dudes en escribirme; estaré disponible toda la semana y "
                "podemos reunirnos cuando te venga bien."),
    ("English", "The next episode will explore how honeybees communicate the location of flowers to the rest of "
                "the hive through a remarkable dance."),
    ("Chinese", "谢谢大家。"),
    ("English", "Ladies and gentlemen, welcome aboard. Please make sure your seat belt is fastened, your tray "
                "table is stowed and your seat back is in the upright position, as we will be taking off shortly. "
                "The flight time today is estimated at two hours and fifteen minutes, and the weather at our "
                "destination is sunny with a light breeze."),
    ("Chinese", "如果你想学好一门外语，最重要的不是背了多少单词，而是每天坚持开口说，哪怕只有十分钟，坚持下去也会看到明显的进步。"),
]


def seconds(language: str, text: str) -> float:
    """Natural-speech duration: CJK characters at 4.5/s (Chinese, Japanese), otherwise words at 2.7/s."""
    if language in ("Chinese", "Japanese"):
        return len(CJK.findall(text)) / CJK_PER_S
    return len(text.split()) / WORDS_PER_S


def frames(language: str, text: str) -> int:
    """Codec frames for the sentence, at least 13 (about 1 s)."""
    return max(13, round(seconds(language, text) * FPS))


def script() -> list[tuple[str, str, int]]:
    return [(lang, text, frames(lang, text)) for lang, text in SCRIPT]
