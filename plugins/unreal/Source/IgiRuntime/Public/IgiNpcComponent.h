// IgiNpcComponent.h - IgiRuntime (Unreal wrapper): one NPC's conversation with the igi daemon.
//
// Say() streams the NPC's reply: OnToken fires per token, then OnReplyDone (or OnError). All
// delegates fire on the game thread, inside the client's Pump(), which TickComponent drives (through
// UIgiSubsystem::PumpOncePerFrame, which also feeds the frame time to the budget helper).
#pragma once

#include <string>

#include "Components/ActorComponent.h"
#include "CoreMinimal.h"

#include "IgiNpcComponent.generated.h"

DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnToken, const FString&, Token, int32, Index);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnReplyDone, const FString&, FullText, const FString&, FinishReason);
DECLARE_DYNAMIC_MULTICAST_DELEGATE_TwoParams(FIgiOnError, const FString&, Code, const FString&, Message);

class UIgiSubsystem;

UCLASS(ClassGroup = (AI), meta = (BlueprintSpawnableComponent))
class IGIRUNTIME_API UIgiNpcComponent : public UActorComponent
{
	GENERATED_BODY()

public:
	UIgiNpcComponent();

	/** NPC name or role (create_session_request.persona). */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI")
	FString Persona = TEXT("Villager");

	/** System message of the chat template. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (MultiLine = true))
	FString SystemPrompt = TEXT("You are a villager in a fantasy game. Answer in one or two short sentences.");

	/** 0 = greedy. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (ClampMin = "0.0", ClampMax = "5.0"))
	float Temperature = 0.7f;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (ClampMin = "1"))
	int32 MaxTokens = 96;

	/** -100..100, higher is served first. */
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "IGI", meta = (ClampMin = "-100", ClampMax = "100"))
	int32 Priority = 0;

	/** Streams the NPC's answer to the player's line. False if a reply is already streaming. */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	bool Say(const FString& Text);

	/** Cancels the reply in progress; OnReplyDone then reports FinishReason "cancelled". */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void Cancel();

	/** Explicit VRAM budget for the daemon (game-wide; overrides the budget helper's proposals). */
	UFUNCTION(BlueprintCallable, Category = "IGI")
	void SetVramBudgetMiB(int32 VramBudgetMiB);

	UFUNCTION(BlueprintPure, Category = "IGI")
	bool IsBusy() const { return !GenerateId.empty() || bSessionPending; }

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnToken OnToken;

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnReplyDone OnReplyDone;

	UPROPERTY(BlueprintAssignable, Category = "IGI")
	FIgiOnError OnError;

	virtual void TickComponent(float DeltaTime, ELevelTick TickType, FActorComponentTickFunction* ThisTickFunction) override;

protected:
	virtual void EndPlay(const EEndPlayReason::Type EndPlayReason) override;

private:
	UIgiSubsystem* GetIgi() const;
	void StartGenerate();
	void Fail(const FString& Code, const FString& Message);

	std::string SessionId;   // daemon session, created lazily on the first Say()
	std::string GenerateId;  // msg_id of the generate_request in progress
	std::string SessionRequestId;
	bool bSessionPending = false;
	FString PendingText;
};
